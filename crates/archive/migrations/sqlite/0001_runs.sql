-- 0001: one row per stored run. The columns are what queries and reports
-- select and group on; `document` keeps the command's full JSON result
-- verbatim, so nothing the schema holds is lost by archiving it.
CREATE TABLE runs (
    id                 INTEGER PRIMARY KEY,
    uuid               TEXT    NOT NULL UNIQUE,
    kind               TEXT    NOT NULL CHECK (kind IN ('test', 'copy', 'path')),
    started_us         INTEGER NOT NULL,   -- UTC, microseconds since the Unix epoch
    finished_us        INTEGER NOT NULL,
    ok                 INTEGER NOT NULL CHECK (ok IN (0, 1)),
    error              TEXT,               -- the error line of a failed run
    sweep              TEXT,
    cell               TEXT,
    repetition         INTEGER,
    path_key           TEXT    NOT NULL,
    peer               TEXT,
    host_name          TEXT    NOT NULL,
    fatpipe_version    TEXT    NOT NULL,
    host               TEXT    NOT NULL,   -- HostFacts as JSON
    link               TEXT,               -- lab link spec as JSON
    throughput_bps     REAL,
    retransmits        INTEGER,
    rtt_min_us         REAL,
    rtt_avg_us         REAL,
    rtt_max_us         REAL,
    rtt_std_us         REAL,
    loss_percent       REAL,
    jitter_ms          REAL,
    cpu_local_percent  REAL,
    cpu_remote_percent REAL,
    bytes              INTEGER,
    document           TEXT                -- fatpipe.test / .copy / .path JSON, verbatim
);
