"""Watching training runs: following growing files, metric series, downsampling, external-tool logs, alerts.

Pure logic for the Runs screen and the dashboard (and ``tunedeck watch``); nothing here imports Textual.

    FileFollower(path).read_new() -> FollowResult      # complete new lines by byte offset
    open_watch_source(path) -> WatchSource              # tunedeck run dir, ms-swift, LLaMA-Factory, HF Trainer
                                                        # output dir or TensorBoard log dir
    open_metrics_feed(source).read_tail() / .poll()     # its normalised records, whatever the writer
    writer_state(source, feed.activity) -> WriterState  # running, idle since …, finished (read-only ones)
    RunSeries().extend(records)                         # columns of steps, times and metrics, EMA, buckets
    evaluate alerts with core.watch.alerts
"""

from __future__ import annotations
