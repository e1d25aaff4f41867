"""The chat screen on a real finished tiny LoRA run, opened from the dashboard: tokens stream in from
the worker process into both panes (base and fine-tuned), and leaving the screen ends the process. The
dashboard's merge and serve keys are tested in test_dashboard_after_training.py."""

from __future__ import annotations

import asyncio
import os
import signal

from core import i18n
from tests.fixtures.lifecycle.finished_run import finished_run
from tests.tui.conftest import fake_monitor, palette_search, quiet_settings, screen_text, wait_for
from tui.app import make_app
from tui.screens.chat import ChatScreen, Transcript, transcript_text
from tui.screens.dashboard import DashboardScreen
from tui.widgets.keys_footer import KeysFooter


async def chat_from_the_dashboard(pilot, app) -> ChatScreen:
    """``a`` on the finished run's dashboard the app opened on: its chat screen, once its model is loaded."""
    await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
    await wait_for(pilot, lambda: app.screen.status == "finished")
    await pilot.press("a")
    await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
    screen = app.screen
    await wait_for(pilot, lambda: screen.ready, timeout=90)
    return screen


def test_dashboard_chat_key_streams_base_and_tuned_replies(shared, private_home, monkeypatch):
    home, run_id = finished_run(shared)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await chat_from_the_dashboard(pilot, app)
            assert screen.has_adapter and screen.compare
            screen.query_one("#chat-temperature").value = "0"
            screen.query_one("#chat-max-tokens").value = "24"
            await pilot.click("#chat-input")
            for key in "Name a colour.":
                await pilot.press("space" if key == " " else key)
            tuned = screen.query_one("#chat-tuned", Transcript)
            base = screen.query_one("#chat-base", Transcript)

            def done() -> bool:
                return not screen.busy and len(tuned.turns) == 2 and len(base.turns) == 2

            # a reply of 0 tokens is refused as `chat --max-tokens 0` is, not made 1: nothing sent, the
            # message kept, the field to mend focused
            screen.query_one("#chat-max-tokens").value = "0"
            await pilot.press("enter")
            await wait_for(pilot, lambda: any("max tokens: got 0; must be at least 1" in n.message
                                              for n in app._notifications))
            assert not tuned.turns and not screen.busy
            assert screen.query_one("#chat-input").value == "Name a colour."
            assert app.focused is screen.query_one("#chat-max-tokens")
            screen.query_one("#chat-max-tokens").value = "24"
            await pilot.click("#chat-input")
            await pilot.press("enter")
            await wait_for(pilot, done, timeout=90)
            assert tuned.turns[0] == ("user", "Name a colour.")
            assert tuned.turns[1][1].strip() == "Blue."
            assert base.turns[1][1] and base.turns[1][1] != tuned.turns[1][1]
            # tokens streamed in: each reply reached the screen in several pieces, not as one block
            assert base.pieces > 1 and tuned.pieces > 1, (base.pieces, tuned.pieces)
            proc = screen.proc
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            # the model process is gone (reaped by a thread: the screen does not wait for it)
            await wait_for(pilot, lambda: proc is not None and proc.poll() is not None)

    asyncio.run(scenario())


def test_chat_on_a_full_fine_tune_is_one_full_width_pane_without_F2(shared, private_home, monkeypatch):
    """A full fine-tune has no adapter to switch off: the "base model (adapter off)" pane used to stay
    empty on the left and F2 stayed in the footer (pressing it only said there was no base). Now the
    fine-tuned pane takes the width, F2 is not offered and does nothing. Runs on the CPU."""
    home, run_id = finished_run(shared, method="full")
    monkeypatch.setenv("TUNEDECK_HOME", str(home))

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            await wait_for(pilot, lambda: app.screen.status == "finished")
            await pilot.press("a")
            await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
            screen = app.screen
            base = screen.query_one("#chat-base", Transcript)
            tuned = screen.query_one("#chat-tuned", Transcript)
            assert not screen.compare and not base.display  # known from the run before the model loads
            await wait_for(pilot, lambda: screen.ready, timeout=90)
            await pilot.pause()
            assert not screen.has_adapter and not base.display
            assert tuned.region.width >= 78, tuned.region  # the whole width of the 80-column screen
            footer = screen_text(app).splitlines()[-1]
            assert "F2" not in footer and "Esc" in footer, footer
            await pilot.press("f2")
            await pilot.pause()
            assert not screen.compare and not base.display
            assert not any("no adapter" in str(n.message) for n in app._notifications)
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))

    asyncio.run(scenario())


def test_a_model_that_does_not_load_keeps_the_reason_on_the_status_line(tmp_path):
    """The worker says why the model did not load, then exits; the status line then read only "the model
    process ended (exit code 1); press Esc and open the chat again" once the notification had gone, the
    reason lost and the advice untrue (it fails the same way again). The reason stays. (A folder with no
    model in it: the worker refuses it before any weights load.)"""
    folder = tmp_path / "not-a-model"
    folder.mkdir()

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = ChatScreen(model_dir=folder)
            await app.push_screen(screen)
            proc = screen.proc
            await wait_for(pilot, lambda: proc is not None and proc.poll() is not None, timeout=120)
            status = screen.query_one("#chat-status")
            await wait_for(pilot, lambda: "did not load" in str(status.render()), timeout=30)
            text = str(status.render())
            assert "has no config.json" in text and "open the chat again" not in text, text
            assert not screen.ready
            await pilot.pause()
            shown = " ".join(screen_text(app).split())  # on screen, wrapped, at 80 columns: not cut at one line
            assert "has no config.json, so it is not a model folder" in shown, screen_text(app)

    asyncio.run(scenario())


def test_ctrl_l_while_a_reply_streams_says_to_wait_instead_of_doing_nothing(tmp_path, monkeypatch):
    """Ctrl+L (clear, in the footer all along) did nothing at all while a reply was being generated: no
    clearing, no word. It says to wait for the reply, and the transcript stays. No model process: the screen
    is put in the state of a reply under way."""
    monkeypatch.setattr(ChatScreen, "_start_worker", lambda self: None)

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = ChatScreen(model_dir=tmp_path)
            await app.push_screen(screen)
            await pilot.pause()
            tuned = screen.query_one("#chat-tuned", Transcript)
            tuned.add("user", "Hi")
            tuned.add("assistant", "Hel")
            screen.busy.add("tuned")
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: any(n.message == "wait for the reply to finish" for n in app._notifications))
            assert tuned.turns == [("user", "Hi"), ("assistant", "Hel")]
            screen.busy.clear()
            await pilot.press("ctrl+l")
            await pilot.pause()
            assert tuned.turns == []

    asyncio.run(scenario())


def test_ctrl_g_stops_the_reply_keeps_it_and_the_model_answers_the_next(shared, private_home, monkeypatch):
    """A reply could not be stopped: Esc ended the whole model process (minutes to load again). Ctrl+G, in
    the footer and the palette while a reply is being generated, ends it: the text so far stays, the
    reply queued beside it (base vs tuned) does not begin, and the same model process answers the next
    message. The random base babbles up to its max tokens (1500 here: it is stopped long before). CPU."""
    home, run_id = finished_run(shared)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            screen = ChatScreen(run_dir=home / "runs" / run_id, compare=True, adapter=True)
            await app.push_screen(screen)
            await wait_for(pilot, lambda: screen.ready, timeout=90)
            proc = screen.proc
            footer = screen.query_one(KeysFooter)
            assert "stop reply" not in dict((d, k) for k, d in footer.shown())  # nothing to stop yet
            screen.query_one("#chat-temperature").value = "0"
            screen.query_one("#chat-max-tokens").value = "1500"
            screen.query_one("#chat-input").value = "Hi"
            await pilot.click("#chat-input")
            await pilot.press("enter")
            base = screen.query_one("#chat-base", Transcript)
            tuned = screen.query_one("#chat-tuned", Transcript)
            await wait_for(pilot, lambda: base.pieces >= 3, timeout=90)  # the base's reply is streaming in
            # Held still until the stop is on its way: a fast box generates the 1500 tokens while the palette is
            # looked at, and the reply would end before Ctrl+G (a state to wait for, not a race with the model).
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                assert ("Ctrl+G", "stop reply") in footer.shown(), footer.shown()
                await palette_search(pilot, app, "stop rep", "stop reply")
                await pilot.press("escape")
                await wait_for(pilot, lambda: app.screen is screen)
                await pilot.press("ctrl+g")  # the stop line is in the worker's stdin when this returns
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            await wait_for(pilot, lambda: not screen.busy, timeout=90)
            status = str(screen.query_one("#chat-status").render())
            assert "reply stopped" in status, status
            kept = base.turns[-1][1]
            assert kept and base.pieces < 1500
            # the tuned reply never began: no empty assistant turn (it went to the model as its answer with the
            # next message), the user's turn kept beside the base's, the field left empty (the base answered)
            assert tuned.turns == [("user", "Hi")] and base.turns[0] == ("user", "Hi")
            assert screen.query_one("#chat-input").value == ""
            assert "stop reply" not in dict((d, k) for k, d in footer.shown())
            screen.query_one("#chat-max-tokens").value = "8"
            screen.query_one("#chat-input").value = "Name a colour."
            await pilot.click("#chat-input")
            await pilot.press("enter")
            await wait_for(pilot, lambda: not screen.busy and len(tuned.turns) == 3, timeout=90)
            assert screen.proc is proc and proc.poll() is None and tuned.turns[-1][1]  # the same model answered
            assert [r for r, _ in tuned.turns] == ["user", "user", "assistant"]
            assert [r for r, _ in base.turns] == ["user", "assistant", "user", "assistant"]
            assert [x for x in tuned.turns if x[0] == "user"] == [x for x in base.turns if x[0] == "user"]
            assert base.turns[1][1] == kept and "done in" in str(screen.query_one("#chat-status").render())
            await pilot.press("escape")

    asyncio.run(scenario())


def take_sends(screen) -> list[str]:
    """Stand in for the screen's model process: the lines it would read from its stdin, collected as written."""
    sent: list[str] = []
    screen.proc = type("Proc", (), {"stdin": type("In", (), {"write": lambda _, line: sent.append(line),
                                                              "flush": lambda _: None})()})()
    return sent


def test_a_reply_stopped_before_any_text_leaves_no_turn_and_gives_the_message_back(tmp_path, monkeypatch):
    """A reply stopped before its first token stayed as an empty assistant turn, sent with the next message as
    the model's answer. Alone (or with the reply beside it stopped as early), nothing was answered: the
    message leaves the transcript and goes back to its field; one stopped with text keeps it. No model
    process: the screen gets the worker's events as the worker writes them."""
    from tui.screens.chat import WorkerEvent

    monkeypatch.setattr(ChatScreen, "_start_worker", lambda self: None)

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = ChatScreen(model_dir=tmp_path)
            await app.push_screen(screen)
            await pilot.pause()
            sent = take_sends(screen)
            screen.ready = True
            tuned = screen.query_one("#chat-tuned", Transcript)
            field = screen.query_one("#chat-input")
            field.value = "Hi"
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(sent) == 1)
            screen.post_message(WorkerEvent({"event": "done", "id": 1, "variant": "tuned", "stopped": True}))
            await wait_for(pilot, lambda: not screen.busy)
            assert tuned.turns == [] and field.value == "Hi"
            assert "your message is back in its field" in str(screen.query_one("#chat-status").render())
            await pilot.press("enter")  # sent again: nothing of the stopped one goes with it
            await wait_for(pilot, lambda: len(sent) == 2)
            import json

            assert json.loads(sent[1])["messages"] == [{"role": "user", "content": "Hi"}]
            screen.post_message(WorkerEvent({"event": "token", "id": 2, "variant": "tuned", "text": "Hel"}))
            screen.post_message(WorkerEvent({"event": "done", "id": 2, "variant": "tuned", "stopped": True}))
            await wait_for(pilot, lambda: not screen.busy)
            assert tuned.turns == [("user", "Hi"), ("assistant", "Hel")] and field.value == ""
            screen.proc = None  # no process to end

    asyncio.run(scenario())


def test_a_warning_of_the_model_process_is_said_as_a_line(tmp_path, monkeypatch):
    """The model process's warnings were dropped; its ``warning`` record (see
    test_lifecycle_chat_worker_warnings.py) is now said in a notification. No model process: the screen gets
    the record as the worker writes it."""
    from tui.screens.chat import WorkerEvent

    monkeypatch.setattr(ChatScreen, "_start_worker", lambda self: None)

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = ChatScreen(model_dir=tmp_path)
            await app.push_screen(screen)
            await pilot.pause()
            message = "UserWarning: this model's cache layout is deprecated (modeling_mine.py:12)"
            screen.post_message(WorkerEvent({"event": "warning", "message": message}))
            await wait_for(pilot, lambda: any(message in str(n.message) for n in app._notifications))
            assert [n.severity for n in app._notifications if message in str(n.message)] == ["warning"]

    asyncio.run(scenario())


def test_side_by_side_a_side_stopped_before_any_text_still_sends_alternating_turns(tmp_path, monkeypatch):
    """Side by side, Ctrl+G after the base answered and before the tuned reply began: the tuned pane keeps
    the user's turn beside the base's (both panes show the same messages) but has no answer to it, and the
    next message sent it two user turns in a row, which a template that demands alternating turns (Gemma's)
    refuses, so that pane could not chat on. Now the unanswered turn is joined to the next one, as both are
    shown; the conversation goes through the Gemma-style template on the bundled tiny tokenizer. No model
    process: the screen gets the worker's events as the worker writes them. CPU only."""
    import json
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from core.lifecycle.chat import prompt_ids
    from tests.core.test_lifecycle_serve_template import GEMMA_TEMPLATE
    from tests.fixtures.lifecycle.finished_run import TINY
    from tui.screens.chat import WorkerEvent

    monkeypatch.setattr(ChatScreen, "_start_worker", lambda self: None)
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    tokenizer.chat_template = GEMMA_TEMPLATE
    gemma = SimpleNamespace(tokenizer=tokenizer, device="cpu")

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            screen = ChatScreen(model_dir=tmp_path)
            await app.push_screen(screen)
            await pilot.pause()
            sent = take_sends(screen)
            screen.ready = screen.has_adapter = screen.compare = True
            base = screen.query_one("#chat-base", Transcript)
            tuned = screen.query_one("#chat-tuned", Transcript)
            field = screen.query_one("#chat-input")
            field.value = "Hi"
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(sent) == 1)
            screen.post_message(WorkerEvent({"event": "token", "id": 1, "variant": "base", "text": "Hello"}))
            screen.post_message(WorkerEvent({"event": "done", "id": 1, "variant": "base", "stopped": True}))
            screen.post_message(WorkerEvent({"event": "done", "id": 2, "variant": "tuned", "stopped": True}))
            await wait_for(pilot, lambda: not screen.busy)
            # what each pane shows: the same user turn, the tuned one unanswered
            assert base.turns == [("user", "Hi"), ("assistant", "Hello")] and tuned.turns == [("user", "Hi")]
            field.value = "Name a colour."
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(sent) == 2)
            replies = {r["variant"]: r["messages"] for r in json.loads(sent[1])["replies"]}
            assert replies["tuned"] == [{"role": "user", "content": "Hi\n\nName a colour."}]
            assert replies["base"] == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                                       {"role": "user", "content": "Name a colour."}]
            for messages in replies.values():  # each side's conversation is one the alternating template takes
                assert prompt_ids(gemma, messages).shape[-1] > 0
            assert [r for r, _ in tuned.turns] == ["user", "user", "assistant"]  # the pane still shows both
            screen.proc = None  # no process to end

    asyncio.run(scenario())


def test_a_conversation_past_the_models_context_is_said_before_generating(shared, private_home, monkeypatch):
    """The chat sent any conversation and max tokens to generate, past the model's context (2048 tokens for
    the bundled tiny model, its config's max_position_embeddings) too; the server refuses such a request.
    Now the worker checks it first with the server's check: nothing is generated, one line says the counts,
    the limit and what to do (clear with Ctrl+L, shorten, lower max tokens), the message goes back to its
    field, and the same model answers once it fits. Side by side: both panes, said once. CPU."""
    home, run_id = finished_run(shared)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            screen = ChatScreen(run_dir=home / "runs" / run_id, compare=True, adapter=True)
            await app.push_screen(screen)
            await wait_for(pilot, lambda: screen.ready, timeout=90)
            proc = screen.proc
            screen.query_one("#chat-temperature").value = "0"
            screen.query_one("#chat-max-tokens").value = "2045"
            screen.query_one("#chat-input").value = "Name a colour."
            await pilot.click("#chat-input")
            await pilot.press("enter")
            status = screen.query_one("#chat-status")
            await wait_for(pilot, lambda: "past this model's context of 2048" in str(status.render()), timeout=90)
            await wait_for(pilot, lambda: not screen.busy)
            line = str(status.render())
            assert "max tokens asks 2045 more" in line and "clear the chat with Ctrl+L" in line, line
            said = [n for n in app._notifications if "past this model's context" in n.message]
            assert len(said) == 1, said
            tuned = screen.query_one("#chat-tuned", Transcript)
            base = screen.query_one("#chat-base", Transcript)
            assert tuned.turns == [] and base.turns == []  # nothing was answered
            assert screen.query_one("#chat-input").value == "Name a colour."  # the message is not lost
            screen.query_one("#chat-max-tokens").value = "12"
            await pilot.click("#chat-input")
            await pilot.press("enter")
            await wait_for(pilot, lambda: not screen.busy and len(tuned.turns) == 2, timeout=90)
            assert tuned.turns[1][1].strip() == "Blue." and screen.proc is proc and proc.poll() is None
            await pilot.press("escape")

    asyncio.run(scenario())


def test_side_by_side_one_side_past_the_context_refuses_the_message_for_both(shared, private_home, monkeypatch):
    """Side by side each pane sends its own conversation, and the base's (its random model babbles) can be
    far longer than the fine-tuned one's. The base was refused past the context while the tuned model
    answered: the panes went out of step. Now the worker checks both before generating either: the message
    goes to neither, back to its field, and one line names the side that is over. The tiny model's context
    is 2048 tokens. CPU."""
    home, run_id = finished_run(shared)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            screen = ChatScreen(run_dir=home / "runs" / run_id, compare=True, adapter=True)
            await app.push_screen(screen)
            await wait_for(pilot, lambda: screen.ready, timeout=90)
            base = screen.query_one("#chat-base", Transcript)
            tuned = screen.query_one("#chat-tuned", Transcript)
            # the conversation so far, as a babbling base and a brief tuned model leave it
            base.turns[:] = [("user", "Hi"), ("assistant", "word " * 450)]
            tuned.turns[:] = [("user", "Hi"), ("assistant", "Blue.")]
            before = (list(base.turns), list(tuned.turns))
            screen.query_one("#chat-temperature").value = "0"
            # past 2048 after the base's ~1360 tokens, not after the tuned's few
            screen.query_one("#chat-max-tokens").value = "1000"
            screen.query_one("#chat-input").value = "Name a colour."
            await pilot.click("#chat-input")
            await pilot.press("enter")
            status = screen.query_one("#chat-status")
            await wait_for(pilot, lambda: "past this model's context" in str(status.render()), timeout=90)
            await wait_for(pilot, lambda: not screen.busy)
            line = str(status.render())
            assert line.startswith("base model (adapter off): the conversation is") and "neither side" in line, line
            assert (base.turns, tuned.turns) == before  # neither answered: still in step
            assert screen.query_one("#chat-input").value == "Name a colour."
            assert len([n for n in app._notifications if "past this model's context" in n.message]) == 1
            screen.query_one("#chat-max-tokens").value = "8"  # fits both: both answer
            await pilot.click("#chat-input")
            await pilot.press("enter")
            await wait_for(pilot, lambda: not screen.busy and len(tuned.turns) == 4 and len(base.turns) == 4,
                           timeout=90)
            await pilot.press("escape")

    asyncio.run(scenario())


def test_side_by_side_done_in_counts_both_replies_not_the_last_ones_alone(tmp_path, monkeypatch):
    """Side by side the worker answers with the base, then with the tuned model; the status line said
    "done in 0.5 s" after ten seconds of the base's reply (the tuned reply's own time). It says the time
    of the exchange: both replies. No model process: the worker's events as it writes them. CPU only."""
    from tui.screens.chat import WorkerEvent

    monkeypatch.setattr(ChatScreen, "_start_worker", lambda self: None)

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = ChatScreen(model_dir=tmp_path)
            await app.push_screen(screen)
            await pilot.pause()
            sent = take_sends(screen)
            screen.ready = screen.has_adapter = screen.compare = True
            status = screen.query_one("#chat-status")
            for n, (base_s, tuned_s, said) in enumerate(((9.5, 0.5, "done in 10.0 s"), (1.0, 2.0, "done in 3.0 s"))):
                screen.query_one("#chat-input").value = "Hi"
                await pilot.press("enter")
                await wait_for(pilot, lambda n=n: len(sent) == n + 1)
                for rid, variant, seconds in ((2 * n + 1, "base", base_s), (2 * n + 2, "tuned", tuned_s)):
                    screen.post_message(WorkerEvent({"event": "token", "id": rid, "variant": variant, "text": "Hey"}))
                    screen.post_message(WorkerEvent({"event": "done", "id": rid, "variant": variant,
                                                     "seconds": seconds, "stopped": False}))
                await wait_for(pilot, lambda: not screen.busy)
                await pilot.pause()
                assert str(status.render()) == said, str(status.render())
            screen.proc = None  # no process to end

    asyncio.run(scenario())


def test_a_turn_label_takes_the_colon_of_the_readers_language():
    """The zh transcript read 你: 你好 / 模型: …, an ASCII colon and space after Chinese; English keeps "you: "."""
    turns = [("user", "你好"), ("assistant", "hello")]
    try:
        i18n.set_language("zh")
        chinese = transcript_text(turns).plain
    finally:
        i18n.set_language("en")
    assert chinese == "你：你好\n\n模型：hello\n\n"
    assert transcript_text(turns).plain == "you: 你好\n\nmodel: hello\n\n"


def test_page_keys_page_a_long_reply_from_the_message_field_and_streaming_does_not_pull_back(tmp_path,
                                                                                          monkeypatch):
    """A reply longer than its pane could not be read back by key: the message field has the focus and took
    PgUp/PgDn itself (doing nothing), and each streamed piece scrolled the pane to its end again. PgUp/PgDn
    page the transcript from the field now, and a reader paged up stays where they are while the reply
    streams in; back at the end, the pane follows it again. No model process: the worker's events are
    posted as it writes them. 80x24."""
    from tui.screens.chat import WorkerEvent

    monkeypatch.setattr(ChatScreen, "_start_worker", lambda self: None)

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = ChatScreen(model_dir=tmp_path)
            await app.push_screen(screen)
            await pilot.pause()
            tuned = screen.query_one("#chat-tuned", Transcript)
            tuned.add("user", "Tell me a long story")
            tuned.add("assistant", "\n".join(f"line {i}" for i in range(80)))
            screen.busy.add("tuned")
            await wait_for(pilot, lambda: tuned.max_scroll_y > 20 and tuned.scroll_y == tuned.max_scroll_y)
            assert app.focused is screen.query_one("#chat-input")
            end = tuned.scroll_y
            await pilot.press("pageup")
            await wait_for(pilot, lambda: tuned.scroll_y < end)
            up = tuned.scroll_y
            for piece in ("\nmore", "\nand more", "\nthe end"):
                screen.post_message(WorkerEvent({"event": "token", "id": 1, "variant": "tuned", "text": piece}))
            await wait_for(pilot, lambda: tuned.turns[-1][1].endswith("the end"))
            await pilot.pause()
            assert tuned.scroll_y == up  # left where the reader is
            await pilot.press("pagedown", "pagedown", "pagedown")
            await wait_for(pilot, lambda: tuned.scroll_y == tuned.max_scroll_y)
            screen.post_message(WorkerEvent({"event": "token", "id": 1, "variant": "tuned", "text": "\nP.S."}))
            await wait_for(pilot, lambda: tuned.turns[-1][1].endswith("P.S."))
            await wait_for(pilot, lambda: tuned.scroll_y == tuned.max_scroll_y and tuned.max_scroll_y > end)
            screen.busy.clear()

    asyncio.run(scenario())


def test_a_pasted_message_of_several_lines_is_sent_whole_with_its_line_breaks(tmp_path, monkeypatch):
    """A prompt pasted into the message field (code, a list) kept only its first line: the rest was dropped
    unsaid and the model got a fragment. Every line stays, each break shown as ⏎ in the one-line field and
    sent as a line break; the system prompt field likewise. No model process: the lines the worker would
    read are taken as they are written. 80x24."""
    import json

    from textual import events

    monkeypatch.setattr(ChatScreen, "_start_worker", lambda self: None)

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = ChatScreen(model_dir=tmp_path)
            await app.push_screen(screen)
            await pilot.pause()
            sent = take_sends(screen)
            screen.ready = True
            system, field = screen.query_one("#chat-system"), screen.query_one("#chat-input")
            system.post_message(events.Paste("Be brief.\nAnswer in English."))
            field.post_message(events.Paste("Fix this:\r\ndef f(x):\n    return x +\n"))
            await wait_for(pilot, lambda: field.value and system.value)
            assert field.value == "Fix this:⏎def f(x):⏎    return x +", field.value
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(sent) == 1)
            messages = json.loads(sent[0])["messages"]
            assert messages == [{"role": "system", "content": "Be brief.\nAnswer in English."},
                                {"role": "user", "content": "Fix this:\ndef f(x):\n    return x +"}]
            tuned = screen.query_one("#chat-tuned", Transcript)
            assert tuned.turns[0] == ("user", "Fix this:\ndef f(x):\n    return x +")
            screen.busy.clear()
            screen.proc = None  # no process to end

    asyncio.run(scenario())


def test_esc_while_the_model_loads_leaves_at_once_and_the_process_is_ended(tmp_path, monkeypatch):
    """Esc while the model loaded (or a reply was generated) froze the screen: it waited 2 s for the process
    to end on its closed stdin, which it reads only between replies, then 5 s more after SIGTERM. The screen
    goes at once and the process is ended behind it. The "model process" here ignores its stdin and SIGTERM
    and holds until a gate file exists: a process that is not done, however fast the box."""
    import subprocess
    import sys
    import textwrap

    gate = tmp_path / "gate"
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print('{{"event": "loading"}}', flush=True)
        while not os.path.exists({str(gate)!r}):
            time.sleep(0.02)
    """)

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)

    monkeypatch.setattr(ChatScreen, "_start_worker", start)

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = ChatScreen(model_dir=tmp_path)
            await app.push_screen(screen)
            proc = screen.proc
            assert proc is not None and proc.stdout is not None
            assert "loading" in proc.stdout.readline()  # started, its SIGTERM ignored from now on
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, ChatScreen))
            assert proc.poll() is None  # the screen went before the process did: it did not wait for it
            gate.touch()
            await wait_for(pilot, lambda: proc.poll() is not None)

    try:
        asyncio.run(scenario())
    finally:
        gate.touch()


async def _send(pilot, screen, text: str) -> None:
    """Type ``text`` into the message field, send it and wait for every reply to end (a state)."""
    screen.query_one("#chat-input").value = text
    await pilot.click("#chat-input")
    await pilot.press("enter")
    tuned = screen.query_one("#chat-tuned", Transcript)
    await wait_for(pilot, lambda: not screen.busy and tuned.turns[-1:] and tuned.turns[-1][0] == "assistant"
                   and tuned.turns[-1][1], timeout=90)


def test_leaving_the_chat_and_coming_back_keeps_the_conversation(shared, private_home, monkeypatch):
    """Esc (or a palette "Go to …") dropped the whole conversation: `a` again opened an empty chat, what the
    user had typed and read gone, the system prompt and settings back to their defaults. Now both panes,
    the system prompt, temperature, max tokens, F2 and an unsent message come back (the model loads again:
    its process ends on leaving). A real tiny LoRA run on the CPU; 80x24."""
    home, run_id = finished_run(shared)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await chat_from_the_dashboard(pilot, app)
            screen.query_one("#chat-system").value = "Answer briefly."
            screen.query_one("#chat-temperature").value = "0"
            screen.query_one("#chat-max-tokens").value = "24"
            await _send(pilot, screen, "Name a colour.")
            before = {v: list(screen.query_one(f"#chat-{v}", Transcript).turns) for v in ("base", "tuned")}
            assert before["tuned"][0] == ("user", "Name a colour.") and before["base"][0] == before["tuned"][0]
            screen.query_one("#chat-input").value = "And a fruit?"  # typed, not sent
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            await pilot.press("a")
            await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.screen is not screen)
            again = app.screen
            await pilot.pause()
            # back before the model has loaded again: read while it loads
            assert {v: again.query_one(f"#chat-{v}", Transcript).turns for v in ("base", "tuned")} == before
            assert again.query_one("#chat-system").value == "Answer briefly."
            assert again.query_one("#chat-temperature").value == "0"
            assert again.query_one("#chat-max-tokens").value == "24"
            assert again.query_one("#chat-input").value == "And a fruit?"
            assert again.compare and again.query_one("#chat-base").display
            await wait_for(pilot, lambda: again.ready, timeout=90)
            assert "Blue." in " ".join(screen_text(app).split())
            assert "checkpoint step" not in screen_text(app)  # the same checkpoint: no line between
            # the conversation goes on: the model is sent the earlier turns too
            assert len(again.query_one("#chat-tuned", Transcript).messages()) == 2
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))

    asyncio.run(scenario())


def test_coming_back_after_the_run_went_on_marks_the_earlier_checkpoints_transcript(shared, private_home,
                                                                                    monkeypatch):
    """The run has a newer checkpoint when the chat is opened again (it was resumed): the earlier
    conversation stays to be read, under a line saying step 15 -> step 30, and the new checkpoint is sent
    only what follows the line (not the earlier checkpoint's replies as its own). The newer checkpoint is
    held out of the run while the first chat runs, as if not yet trained. CPU; 80x24."""
    home, run_id = finished_run(shared)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    checkpoints = home / "runs" / run_id / "checkpoints"
    newest = max(checkpoints.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert newest.name == "checkpoint-30", sorted(p.name for p in checkpoints.iterdir())
    aside = home / "checkpoint-30-not-yet"
    newest.rename(aside)

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await chat_from_the_dashboard(pilot, app)
            assert screen.step == 15
            screen.query_one("#chat-temperature").value = "0"
            screen.query_one("#chat-max-tokens").value = "8"
            await _send(pilot, screen, "Hi")
            earlier = list(screen.query_one("#chat-tuned", Transcript).turns)
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            aside.rename(newest)  # the run was resumed meanwhile and saved step 30
            await pilot.press("a")
            await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.screen is not screen)
            again = app.screen
            await wait_for(pilot, lambda: again.ready, timeout=90)
            assert again.step == 30
            tuned = again.query_one("#chat-tuned", Transcript)
            assert tuned.turns[:2] == earlier and tuned.turns[2][0] == "note"
            assert "step 15 → now step 30" in tuned.turns[2][1]
            assert tuned.messages() == []  # nothing of step 15's conversation is sent to step 30
            await pilot.pause()
            shown = screen_text(app)  # at 80 columns, side by side: the line wraps in each pane
            assert "step 15 → now" in shown and "step 30; the model is sent" in shown, shown
            await _send(pilot, again, "Hi")
            assert [m["role"] for m in tuned.messages()] == ["user", "assistant"]
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))

    asyncio.run(scenario())


def test_a_model_process_left_to_its_reaper_is_killed_when_the_app_exits(tmp_path):
    """Esc on a loading model terminates it and leaves a daemon thread to kill it if it does not end; the app
    quit right after took that thread with it, and a model that reads no SIGTERM (a load in progress) kept
    running. The app's exit (``run_app``) finishes the reapers: terminated, joined briefly, then killed. A real
    child that ignores SIGTERM, ready once its gate file exists; no GPU."""
    import subprocess
    import sys
    import time

    from tui.screens.chat import _reaping, finish_reapers, start_reaper

    gate = tmp_path / "ignoring"
    proc = subprocess.Popen([sys.executable, "-c",
                             "import pathlib, signal, sys, time\n"
                             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                             f"pathlib.Path({str(gate)!r}).touch()\n"
                             "time.sleep(600)\n"], text=True)
    try:
        deadline = time.monotonic() + 60
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gate.exists()
        proc.terminate()  # what Esc does to a loading model: ignored here
        reaper = start_reaper(proc)
        finish_reapers(timeout_s=0.5)
        assert proc.poll() is not None  # killed, not left to a thread that dies with the app
        reaper.join(30)
        assert not reaper.is_alive() and reaper not in _reaping
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_palette_jump_to_another_section_leaves_the_chat_as_esc_does(shared, private_home, monkeypatch):
    """"Go to GPUs" from the palette while chatting switched sections but left the chat screen on the Runs
    stack, its model process running: GPU memory held behind the user's back, on the very screen that shows
    GPU memory. The jump now leaves the chat as Esc does: the model process ends, the conversation is kept
    for the chat opened again, the dashboard under it stays. A real tiny LoRA run on the CPU; 80x24."""
    home, run_id = finished_run(shared)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    from tests.tui.conftest import palette_search
    from tui.screens.gpus import GpuScreen

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await chat_from_the_dashboard(pilot, app)
            proc = screen.proc
            assert proc is not None and proc.poll() is None
            screen.query_one("#chat-input").value = "Kept?"  # typed, not sent
            await palette_search(pilot, app, "go to gpus", "Go to GPUs")
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
            assert not any(isinstance(s, ChatScreen) for stack in app._screen_stacks.values() for s in stack)
            assert isinstance(app._screen_stacks["runs"][-1], DashboardScreen)  # the dashboard stays
            await wait_for(pilot, lambda: proc.poll() is not None, timeout=60)  # the reaper ends it
            kept = list(app.chat_kept.values())
            assert len(kept) == 1 and kept[0].draft == "Kept?", kept

    asyncio.run(scenario())
