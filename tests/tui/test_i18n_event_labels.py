"""The dashboard's events table: known event names translated, unknown ones (other tools) shown raw,
and a reason recorded as a message rendered in the reader's language."""

from __future__ import annotations

from core import i18n
from core.i18n import Message
from tui.screens.dashboard import KNOWN_EVENTS, DashboardScreen, event_label


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
        assert row[2].startswith("reason=训练进程被 SIGKILL 结束")
        assert "reason_message" not in row[2] and "exit_code=-9" in row[2]
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
