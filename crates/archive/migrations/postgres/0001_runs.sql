-- 0001: one row per stored run. The columns are what queries and reports
-- select and group on; `document` keeps the command's full JSON result
-- verbatim (type json, not jsonb: json keeps the text as written, and
-- nothing queries inside it), host facts and the link spec are jsonb so a
-- fleet can query them (`host->'sysctls'`).
CREATE TABLE runs (
    id                 BIGSERIAL PRIMARY KEY,
    uuid               UUID        NOT NULL UNIQUE,
    kind               TEXT        NOT NULL CHECK (kind IN ('test', 'copy', 'path')),
    started            TIMESTAMPTZ NOT NULL,
    finished           TIMESTAMPTZ NOT NULL,
    ok                 BOOLEAN     NOT NULL,
    error              TEXT,
    sweep              TEXT,
    cell               TEXT,
    repetition         INTEGER,
    path_key           TEXT        NOT NULL,
    peer               TEXT,
    host_name          TEXT        NOT NULL,
    fatpipe_version    TEXT        NOT NULL,
    host               JSONB       NOT NULL,
    link               JSONB,
    throughput_bps     DOUBLE PRECISION,
    retransmits        BIGINT,
    rtt_min_us         DOUBLE PRECISION,
    rtt_avg_us         DOUBLE PRECISION,
    rtt_max_us         DOUBLE PRECISION,
    rtt_std_us         DOUBLE PRECISION,
    loss_percent       DOUBLE PRECISION,
    jitter_ms          DOUBLE PRECISION,
    cpu_local_percent  DOUBLE PRECISION,
    cpu_remote_percent DOUBLE PRECISION,
    bytes              BIGINT,
    document           JSON
);
