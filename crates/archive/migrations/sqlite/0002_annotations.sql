-- 0002: dated notes on a path ("link upgraded to 622 Mbit/s"), so runs can
-- be selected before or after one, and the indexes that resume (sweep,
-- cell, repetition) and the path/time selections use.
CREATE TABLE annotations (
    id       INTEGER PRIMARY KEY,
    path_key TEXT    NOT NULL,
    at_us    INTEGER NOT NULL,             -- UTC, microseconds since the Unix epoch
    note     TEXT    NOT NULL,
    UNIQUE (path_key, at_us, note)
);

CREATE INDEX runs_sweep ON runs (sweep, cell, repetition);
CREATE INDEX runs_path_started ON runs (path_key, started_us);
CREATE INDEX runs_started ON runs (started_us);
