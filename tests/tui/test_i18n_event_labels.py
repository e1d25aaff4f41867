"""The dashboard's events table: known event names translated, unknown ones (other tools) shown raw,
and a reason recorded as a message rendered in the reader's language."""

from __future__ import annotations

from core import i18n
from core.i18n import Message
from tui.screens.dashboard import KNOWN_EVENTS, DashboardScreen, event_label
from tui.screens.dashboard.header import event_field


def test_every_known_event_has_a_label_in_every_language():
    for language in i18n.available_languages():
        messages = i18n.catalogue(language)
        assert sorted(name for name in KNOWN_EVENTS if f"dashboard.event.{name}" not in messages) == []


def test_labels_follow_the_language_and_unknown_events_stay_raw():
    try:
        i18n.set_language("zh")
        assert event_label("checkpoint_saved") == "检查点已保存" and event_label("stop_requested") == "请求停止"
        assert event_label("swift_custom_event") == "swift_custom_event"
        reason = Message("runs.reason_signal", signal="SIGKILL")
        row = DashboardScreen._event_row({"time": "2026-11-30T01:02:03Z", "ts": 1.0, "event": "failed",
                                          "reason": reason.english(), "exit_code": -9,
                                          "reason_message": reason.to_record()})
        assert row[0] == "01:02:03" and row[1] == "失败"
        assert row[2].startswith("原因：训练进程被 SIGKILL 结束")
        assert "reason_message" not in row[2] and row[2].endswith("；退出码：-9")
        i18n.set_language("en")
        assert event_label("checkpoint_saved") == "checkpoint_saved"  # English shows the recorded name
        row = DashboardScreen._event_row({"time": "x", "event": "failed", "reason": "older text"})
        assert row == ("x", "failed", "reason=older text")
    finally:
        i18n.set_language("en")


def test_an_empty_field_is_left_out_of_the_detail():
    """A run that finished records ``"reason": ""``: the detail said ``exit_code=0 reason=``."""
    row = DashboardScreen._event_row({"time": "x", "event": "finished", "exit_code": 0, "reason": ""})
    assert row[2] == "exit_code=0"


def test_an_events_fields_are_named_in_the_readers_language():
    """A finished run's event read 已完成 exit_code=0 in Chinese: the fields tunedeck writes are named in
    Chinese with a Chinese colon between them, sizes read as sizes, another tool's fields keep their names;
    English keeps the recorded names (as it keeps the event names)."""
    record = {"time": "x", "event": "checkpoint_saved", "step": 250, "bytes": 3_200_000_000, "epoch_x": 1}
    try:
        i18n.set_language("zh")
        assert DashboardScreen._event_row({"time": "x", "event": "finished", "exit_code": 0}) == ("x", "已完成",
                                                                                                  "退出码：0")
        assert DashboardScreen._event_row(record)[2] == "步：250；大小：3.2 GB；epoch_x：1"
    finally:
        i18n.set_language("en")
    assert DashboardScreen._event_row(record)[2] == "step=250 bytes=3.2 GB epoch_x=1"
    assert event_field("exit_code", 0) == "exit_code=0"
