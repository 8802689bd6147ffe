-- 0002: dated notes on a path ("link upgraded to 622 Mbit/s"), so runs can
-- be selected before or after one, and the indexes that resume (sweep,
-- cell, repetition) and the path/time selections use.
CREATE TABLE annotations (
    id       BIGSERIAL   PRIMARY KEY,
    path_key TEXT        NOT NULL,
    at       TIMESTAMPTZ NOT NULL,
    note     TEXT        NOT NULL,
    UNIQUE (path_key, at, note)
);

CREATE INDEX runs_sweep ON runs (sweep, cell, repetition);
CREATE INDEX runs_path_started ON runs (path_key, started);
CREATE INDEX runs_started ON runs (started);
