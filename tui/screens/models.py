"""The model browser (``m``): search ModelScope or Hugging Face, read a model's card and facts, see
whether it trains on this box, download it (detached, resumable), and manage what is on disk.

Every hub call runs in a worker thread and comes back as a message; the download runs in its own
process (``core.hub.download``) and this screen only reads its state file, so leaving the screen, the
app or the SSH session does not stop it, and coming back re-attaches.

A failed search shows its ``HubProblem`` (``core.hub.problems``: what failed, what to do, the raw
detail last, scrollable) in place of the results; filter keys wait a moment before they search, and
a hub found out of reach is not asked again for a while (``core.hub.reachability``; F5 and Enter ask
anyway). The Local tab lists the bundled models too, so a box without a network still has a model to
plan. Keys are offered by state (``check_action``): the hub's keys on the Hub tab, delete on a model
on disk, download once a model is open.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import (
    ContentSwitcher,
    DataTable,
    Header,
    Input,
    Markdown,
    ProgressBar,
    Static,
)

from core.errors import TunedeckError
from core.hub.download import human_bytes
from core.hub.problems import HubProblem
from core.hub.reachability import HubReachability
from core.hub.records import HUBS, SIZE_CLASSES, SORTS, ModelDetails, SearchPage, SearchQuery
from core.i18n import join_words, t
from core.text_width import cell_len, truncate
from core.units import UNKNOWN, format_duration, format_magnitude, plural_key
from tui.screens.error_modal import report_failed_worker, report_unexpected
from tui.widgets.keys_footer import KeysFooter

OWNERS = ("", "Qwen", "deepseek-ai", "LLM-Research", "meta-llama", "mistralai", "google")
TASKS = ("text-generation", "")
HUB_LABELS = {"modelscope": "ModelScope", "hf": "Hugging Face"}
# A filter key waits this long for the next one before it searches: a burst of keys asks the hub once.
SEARCH_DELAY_S = 0.4
# Actions of the Hub tab only; the Local tab does not offer them.
# The Hub tab's model column: as wide as its longest name up to HUB_ID_MAX, cut to no less than HUB_ID_MIN.
HUB_ID_MIN = 12
HUB_ID_MAX = 44
# The Local tab's model column: up to LOCAL_ID_MAX cells, cut to no less than LOCAL_ID_MIN; the path beside
# it keeps LOCAL_LAST_MIN cells where the name can give them.
LOCAL_ID_MAX = 50
LOCAL_ID_MIN = 16
LOCAL_LAST_MIN = 16
HUB_COLUMNS = ("id", "params", "downloads", "updated", "license")
HUB_TAB_ACTIONS = frozenset({"focus_search", "toggle_hub", "cycle_owner", "cycle_task", "cycle_size", "cycle_sort"})


def _count(value: int | None) -> str:
    return format_magnitude(value, unknown="?")  # the hub's tables mark an unknown count "?"


def _plain(text: str) -> str:
    """``text`` shown as it is inside markup (hub messages carry brackets such as ``[E1020]``)."""
    return text.replace("[", "\\[")


def _cycle(values: tuple[str, ...], current: str) -> str:
    return values[(values.index(current) + 1) % len(values)] if current in values else values[0]


def _other_hub(hub: str) -> str:
    return _cycle(HUBS, hub)


PART_SEP = " · "  # how the download line's catalogue messages join their parts


def _local_key(row: Any) -> str | None:
    """A Local tab row's identity from one listing to the next: its folder (a model on disk, a bundled one)."""
    return None if row is None else str(row.path)


def _fit_parts(text: str, width: int) -> str:
    """``text`` on one line of ``width`` cells: its `` · `` parts dropped whole from the end (an empty one
    always), never a number cut in half or a dangling separator; the first part alone is cut with an ellipsis."""
    parts = [part for part in text.split(PART_SEP) if part.strip()]
    while len(parts) > 1 and cell_len(PART_SEP.join(parts)) > width:
        parts.pop()
    return truncate(PART_SEP.join(parts), max(1, width))


def _model_in_line(key: str, model: str, width: int, reserve: int = 0, **values: Any) -> str:
    """``model`` as the download line ``t(key)`` of ``width`` cells can hold it: cut in its middle where it
    would leave the rest of the line no room. A long id had taken the whole line, the numbers and "stopped;
    d resumes it" cut off. The id keeps 24 cells at the least beside as many of the line's parts as that
    leaves room for (the first, its sizes and what happened, always). A file, a path or an error, which
    ``values`` give, is measured as empty: ``reserve`` cells are kept for it."""
    measured = {name: ("" if name in ("file", "path", "error") else value) for name, value in values.items()}
    parts = [part for part in t(key, model="", **measured).split(PART_SEP) if part.strip()]
    room = width
    for count in range(len(parts), 0, -1):
        room = width - cell_len(PART_SEP.join(parts[:count])) - reserve
        if room >= min(cell_len(model), 24):
            break
    return model if cell_len(model) <= room else _ellipsize_middle(model, max(room, 12))


def _line_of_model(key: str, model: str, width: int, reserve: int = 0, **values: Any) -> str:
    """``t(key)`` about ``model`` in ``width`` cells: ``_model_in_line``, then ``_fit_parts``."""
    return _fit_parts(t(key, model=_model_in_line(key, model, width, reserve, **values), **values), width)


def _ellipsize_middle(text: str, width: int) -> str:
    """``text`` in ``width`` cells with its middle replaced by an ellipsis: a path keeps its root and, with two
    thirds of the room, its end (the model's own folder)."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return "…"[:max(0, width)]
    tail_room = width - 1 - (width - 1) // 3
    head = truncate(text, width - tail_room)[:-1] if width - tail_room > 0 else ""
    tail: list[str] = []
    used = 0
    for char in reversed(text):
        if used + cell_len(char) > tail_room:
            break
        tail.append(char)
        used += cell_len(char)
    return head + "…" + "".join(reversed(tail))


def _local_complete(model: Any) -> bool:
    """A model on disk that trains as it is (``core.hub.local.LocalModel.complete``; a config.json where the
    listing does not tell about weights)."""
    return bool(getattr(model, "complete", model.has_config))


def _download_of(status: Any, model: Any) -> bool:
    """Whether the download ``status`` filled ``model``'s folder (a LocalModel): the same folder, or the same
    model from the same hub."""
    try:
        if status.target_dir and Path(status.target_dir).resolve() == Path(model.path).resolve():
            return True
    except OSError:
        pass
    return bool(status.model_id == model.model_id and status.hub == model.source)


def _is_incomplete(model: Any) -> bool:
    """A Local tab row that is a download not finished (not a bundled model, not a complete one)."""
    from core.hub.local import LocalModel

    return isinstance(model, LocalModel) and not _local_complete(model)


class SearchDone(Message):
    def __init__(self, page: SearchPage | None, append: bool, problem: HubProblem | None, token: int) -> None:
        super().__init__()
        self.page = page
        self.append = append
        self.problem = problem
        self.token = token


class DetailsDone(Message):
    def __init__(self, model_id: str, details: ModelDetails | None, facts: str, problem: HubProblem | None,
                 params: int | None = None, hub: str = "") -> None:
        super().__init__()
        self.hub = hub  # the hub asked: an answer for the other one, after h, is dropped
        self.params = params  # counted from config.json
        self.model_id = model_id
        self.details = details
        self.facts = facts
        self.problem = problem


class LocalListed(Message):
    def __init__(self, models: list[Any], bundled: list[Any], downloads: list[Any]) -> None:
        super().__init__()
        self.models = models
        self.bundled = bundled
        self.downloads = downloads  # tunedeck's download records (DownloadStatus), newest first


class LocalFacts(Message):
    """The facts and fit of a Local tab model, read from its config.json on disk (``text``); ``path``: the
    model's folder, which row they are of."""

    def __init__(self, text: str, path: str = "") -> None:
        super().__init__()
        self.text = text
        self.path = path


class DeleteChecked(Message):
    """Whether the Local tab's ``model`` may be deleted now (read off the UI thread): ``refusal`` says why not
    and the way out (a download still running into it, a live run training on it), "" when it may."""

    def __init__(self, model: Any, refusal: str) -> None:
        super().__init__()
        self.model = model
        self.refusal = refusal


class DownloadStarted(Message):
    """``d``'s outcome: a download started (``job_dir``), one of the model already running and joined
    (``joined``: its own choice of files goes on), the model already whole on disk (``already``: its folder,
    nothing started), or ``error``."""

    def __init__(self, job_dir: Path | None, error: str | None, model_id: str = "", joined: bool = False,
                 already: Path | None = None) -> None:
        super().__init__()
        self.job_dir = job_dir
        self.error = error
        self.model_id = model_id
        self.joined = joined
        self.already = already


class DownloadPolled(Message):
    """The download the line shows (``job_dir``) and its state (``status``), read off the UI thread from the
    one it showed when the poll began (``asked``): a poll begun before ``d`` picked another is not shown."""

    def __init__(self, asked: Path | None, job_dir: Path | None, status: Any | None,
                 error: BaseException | None = None, picks: int = 0) -> None:
        super().__init__()
        self.asked = asked
        self.picks = picks  # the screen's count of picks (``ModelsScreen._picks``) when the poll began
        self.job_dir = job_dir
        self.status = status
        self.error = error  # the read raised (a record half written, edited by hand): the line stays as it was


# The download states whose reason ``e`` shows whole: a failure's, and why a record cannot be read (which file, key).
EXPLAINED_STATES = ("failed", "unreadable")


def _running(target: tuple[str, str, Any]) -> bool:
    """Whether the download record of a Local row ``d`` would resume (``ModelsScreen._resumable``) runs now."""
    return target[2] is not None and target[2].active


class ModelsScreen(Screen[None]):
    """Hub search with a details pane, a local tab and a download line."""

    AUTO_FOCUS = "#models-results"  # letters are commands here; the search box takes them only after s

    DEFAULT_CSS = """
    ModelsScreen #models-status { height: auto; max-height: 3; padding: 0 1; color: $foreground-muted; }
    ModelsScreen #models-tabs { height: 1fr; }
    ModelsScreen #hub-tab { height: 1fr; }
    ModelsScreen #hub-left { width: 3fr; min-width: 40; }
    ModelsScreen #models-search { height: 3; }
    ModelsScreen #models-results { height: 1fr; }
    ModelsScreen #models-message { height: 1fr; display: none; padding: 0 1; }
    ModelsScreen #models-message-text { height: auto; }
    ModelsScreen #models-details { width: 2fr; min-width: 30; border-left: solid $foreground-muted; padding: 0 1; }
    ModelsScreen #details-facts { height: auto; }
    ModelsScreen #details-download { height: auto; color: $accent; margin-bottom: 1; }
    ModelsScreen #details-card { height: auto; margin: 0; padding: 0; }
    ModelsScreen #local-tab { height: 1fr; }
    /* the counts and the bundled line: two lines each at 80 columns with an unfinished download */
    ModelsScreen #local-summary { height: auto; max-height: 4; padding: 0 1; color: $foreground-muted; }
    ModelsScreen #local-models { height: 1fr; }
    ModelsScreen #local-details { height: auto; max-height: 10; padding: 0 1; display: none;
                                  border-top: solid $foreground-muted; }
    ModelsScreen #download-line { height: 1; padding: 0 1; }
    ModelsScreen #download-bar { height: 1; padding: 0 1; }
    ModelsScreen #download-bar Bar { width: 1fr; }
    """

    BINDINGS = [
        Binding("s", "focus_search", t("modelsscreen.key.search"), id="models.search"),
        Binding("h", "toggle_hub", t("modelsscreen.key.hub"), id="models.hub"),
        Binding("d", "download", t("modelsscreen.key.download"), id="models.download"),
        Binding("p", "wizard", t("modelsscreen.key.wizard"), id="models.wizard"),
        Binding("1", "tab('hub')", t("modelsscreen.key.tab_hub"), show=False, id="models.tab_hub"),
        Binding("2", "tab('local')", t("modelsscreen.key.tab_local"), show=False, id="models.tab_local"),
        Binding("o", "cycle_owner", t("modelsscreen.key.owner"), show=False, id="models.owner"),
        Binding("k", "cycle_task", t("modelsscreen.key.task"), show=False, id="models.task"),
        Binding("z", "cycle_size", t("modelsscreen.key.size"), show=False, id="models.size"),
        Binding("b", "cycle_sort", t("modelsscreen.key.sort"), show=False, id="models.sort"),
        Binding("f", "toggle_files", t("modelsscreen.key.files"), show=False, id="models.files"),
        Binding("c", "cancel_download", t("modelsscreen.key.cancel"), show=False, id="models.cancel"),
        Binding("e", "why_failed", t("modelsscreen.key.why"), show=False, id="models.why"),
        Binding("x", "delete_local", t("modelsscreen.key.delete"), show=False, id="models.delete"),
        Binding("f5", "refresh", t("modelsscreen.key.refresh"), show=False, id="models.refresh"),
    ]

    def __init__(self) -> None:
        super().__init__(name="models")
        self.hub = "modelscope"
        self.query_state = SearchQuery()
        self.page: SearchPage | None = None
        self.searching = False
        self.search_token = 0
        self.details: ModelDetails | None = None
        self.local_models: list[Any] = []  # the models on disk (LocalModel)
        self.local_rows: list[Any] = []  # the Local tab's rows: those on disk, then the bundled ones
        self._local_details_of: str | None = None  # the folder of the row whose facts the Local details show
        self.local_downloads: list[Any] = []  # the download records the Local tab was listed with
        self.job_dir: Path | None = None
        self._polling = self._poll_again = False  # _refresh_download's worker under way; another asked
        self._poll_failed = False  # the last poll raised (said once until one reads again)
        # Picks of the line's download by the screen (d, a model deleted, opening): a poll begun before the last one
        # is not shown, even when it asked of the same folder (d on the download the line showed stopped).
        self._picks = 0
        self.download_active = False
        self.line_status: Any = None  # the download the line shows (DownloadStatus), as last read
        self._listed_at: tuple[Any, ...] | None = None  # that download's (job, status, files done) the Local tab last saw
        self.tab = "hub"
        self.all_files = False  # False: one weight format (safetensors first); True: every file
        self.reachability = HubReachability()
        self.message_kind: str | None = None  # what stands in for the results: "problem", "empty" or None
        self.queries_sent = 0  # searches sent to a hub (not those the memory of an unreachable hub saved)
        self._search_timer: Any = None
        self._filters_extra = ""  # the Hub tab's status under its filters (found, searching), kept for its return
        self._local_table_rows: list[tuple[str, ...]] = []  # the Local tab's cells, before fitting the width
        self._hub_rows: dict[str, list[str]] = {}  # the Hub tab's cells by model id, before fitting the width
        self._unusable = 0  # results of the pages listed left out, their id being no hub id (SearchPage.unusable)

    # --- layout ------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="models-status")
        with ContentSwitcher(initial="hub-tab", id="models-tabs"):
            with Horizontal(id="hub-tab"):
                with Vertical(id="hub-left"):
                    yield Input(placeholder=t("modelsscreen.search_placeholder"), id="models-search")
                    yield DataTable(id="models-results", cursor_type="row")
                    with VerticalScroll(id="models-message"):
                        yield Static("", id="models-message-text")
                with VerticalScroll(id="models-details"):
                    yield Static(t("modelsscreen.pick_model"), id="details-facts")
                    yield Static("", id="details-download")
                    yield Markdown("", id="details-card")
            with Vertical(id="local-tab"):
                yield Static("", id="local-summary")
                yield DataTable(id="local-models", cursor_type="row")
                yield Static("", id="local-details")
        yield Static("", id="download-line")
        bar = ProgressBar(total=100, show_eta=False, id="download-bar")
        bar.display = False  # until there is a download to measure: "no download" needs no empty bar under it
        yield bar
        yield KeysFooter()

    def on_mount(self) -> None:
        self.title = t("app.title")
        self.sub_title = t("app.mode.models")
        self._show_filters()
        self._fill_hub_table()
        self._reattach()
        self.set_interval(0.5, self._refresh_download)
        self.query_one("#models-results", DataTable).focus()
        self.run_search()

    # --- search ------------------------------------------------------------------------------------
    def _show_filters(self, extra: str = "") -> None:
        """The Hub tab's filters (and ``extra``: found, searching) on the status line; on the Local tab
        what it lists instead (no hub, no filter applies there)."""
        self._filters_extra = extra
        if self.tab == "local":
            self.query_one("#models-status", Static).update(t("modelsscreen.local_status"))
            return
        q = self.query_state
        line = t("modelsscreen.filters", hub=HUB_LABELS[self.hub], owner=q.owner or t("modelsscreen.any"),
                 task=q.task or t("modelsscreen.any"), size=t(f"modelsscreen.size.{q.size_class}"),
                 sort=t(f"modelsscreen.sort.{q.sort}"))
        self.query_one("#models-status", Static).update(line + (f"\n{_plain(extra)}" if extra else ""))

    def _focus_list(self) -> None:
        """The focus on what the Hub tab shows: the results, or the message standing in for them."""
        if self.tab == "hub":
            self.query_one("#models-message" if self.message_kind else "#models-results").focus()

    def _show_message(self, kind: str | None, text: str = "") -> None:
        """Put ``text`` (a problem, or an empty result) in place of the results; None brings them back."""
        box = self.query_one("#models-message", VerticalScroll)
        table = self.query_one("#models-results", DataTable)
        on_list = self.focused in (box, table) or self.focused is None
        if kind is not None:
            self.query_one("#models-message-text", Static).update(text)
            box.scroll_home(animate=False)
        box.display = kind is not None
        table.display = kind is None
        changed = kind != self.message_kind
        self.message_kind = kind
        if on_list:
            self._focus_list()
        if changed:
            self.refresh_bindings()

    def _problem_text(self, problem: HubProblem, remembered_age: float | None = None) -> str:
        """What failed, what to do, the ways on from here, and the raw detail last (it scrolls)."""
        lines = []
        if remembered_age is not None:
            note = t("modelsscreen.problem_remembered", hub=HUB_LABELS[problem.hub], age=round(remembered_age))
            lines.append(f"[$warning]{_plain(note)}[/]")
        lines.append(f"[b $error]{_plain(problem.summary)}[/]")
        lines += [f"• {_plain(advice)}" for advice in problem.advice]
        if problem.offline:
            lines.append(f"• {_plain(t('modelsscreen.problem_offline'))}")
        lines.append(f"• {_plain(t('modelsscreen.problem_keys', other=HUB_LABELS[_other_hub(problem.hub)]))}")
        if problem.detail:
            lines += ["", f"[b]{t('modelsscreen.problem_detail')}[/]",
                      f"[$foreground-muted]{_plain(problem.detail)}[/]"]
        return "\n".join(lines)

    def _no_results_text(self) -> str:
        q = self.query_state
        hub = HUB_LABELS[self.hub]
        title = (t("hub.search.none", query=q.text, hub=hub) if q.text
                 else t("hub.search.none_filters", hub=hub))
        if self.page is not None and self.page.has_more and q.size_class != "any":
            from core.hub.records import SIZE_SCAN_PAGES

            # the scan for the size class stopped with pages left: not "no models match"
            title = t("hub.search.size_not_yet", size=t(f"modelsscreen.size.{q.size_class}"), first=1,
                      last=self.page.page, total=self.page.total, hub=hub, pages=SIZE_SCAN_PAGES)
        lines = [f"[b]{_plain(title)}[/]"]
        active = [t(f"modelsscreen.active.{name}", value=value) for name, value in (
            ("owner", q.owner), ("task", q.task),
            ("size", t(f"modelsscreen.size.{q.size_class}") if q.size_class != "any" else "")) if value]
        if active:
            lines.append(f"• {_plain(t('modelsscreen.no_results_filters', filters=join_words(active)))}")
        lines.append(f"• {_plain(t('modelsscreen.no_results_hint', other=HUB_LABELS[_other_hub(self.hub)]))}")
        return "\n".join(lines)

    def _search_soon(self) -> None:
        """Search after ``SEARCH_DELAY_S`` unless another filter key comes first; at once say so when the
        hub was found out of reach a moment ago (nothing is asked then)."""
        self.search_token += 1  # an answer still on its way is for the old filters
        if self._search_timer is not None:
            self._search_timer.stop()
            self._search_timer = None
        if self.reachability.recent_failure(self.hub) is not None:
            self.run_search()
            return
        self._show_filters(t("modelsscreen.searching", hub=HUB_LABELS[self.hub]))
        self._search_timer = self.set_timer(SEARCH_DELAY_S, self._search_now)

    def _search_now(self) -> None:
        self._search_timer = None
        self.run_search()

    def run_search(self, append: bool = False, force: bool = False) -> None:
        """Ask the hub for the first page (or the next, ``append``); not while it is remembered out of
        reach, unless ``force`` (F5, Enter)."""
        if self._search_timer is not None:
            self._search_timer.stop()
            self._search_timer = None
        if not append:
            self.query_state = replace(self.query_state, page=1)
        self.search_token += 1
        recent = None if force else self.reachability.recent_failure(self.hub)
        if recent is not None:
            self.searching = False
            if not append:
                self._set_hub_rows({})
                self.page = None
            self._show_filters()
            self._show_message("problem", self._problem_text(recent.problem, recent.age_s))
            return
        self.searching = True
        self.queries_sent += 1
        self._show_filters(t("modelsscreen.searching", hub=HUB_LABELS[self.hub]))
        self._search_worker(self.hub, self.query_state, append, self.search_token)

    @work(thread=True, exclusive=True, group="hub-search", exit_on_error=False)
    def _search_worker(self, hub: str, query: SearchQuery, append: bool, token: int) -> None:
        from core.hub.problems import describe_error
        from core.hub.source import open_hub

        endpoint = ""
        try:
            source = open_hub(hub)
            endpoint = source.endpoint
            page = source.search(query)
        except (TunedeckError, OSError) as exc:  # a HubError, a network or disk error: said on screen
            self.post_message(SearchDone(None, append, describe_error(exc, hub, endpoint), token))
            return
        except Exception as exc:  # an SDK surprise: said on screen too, and the error modal and log
            report_unexpected(self.app, exc, "models.search")
            self.post_message(SearchDone(None, append, describe_error(exc, hub, endpoint), token))
            return
        self.post_message(SearchDone(page, append, None, token))

    def on_worker_state_changed(self, event: Any) -> None:
        # A worker that ended in an exception nothing caught: reported, and a search no longer "searching".
        if report_failed_worker(self.app, event) and event.worker.group == "hub-search":
            self.searching = False
            self._show_filters()

    def on_search_done(self, message: SearchDone) -> None:
        if message.token != self.search_token:
            return  # an older search's answer
        self.searching = False
        table = self.query_one("#models-results", DataTable)
        if message.problem is not None:
            self.reachability.failed(message.problem)
            self._show_filters()
            if message.append:  # the next page failed: the rows shown stay
                self.notify(message.problem.message(), severity="error", timeout=10)
                return
            self._set_hub_rows({})
            self.page = None
            self._show_message("problem", self._problem_text(message.problem))
            return
        self.reachability.answered(self.hub)
        page = message.page
        assert page is not None
        self.page = page
        rows = dict(self._hub_rows) if message.append else {}
        self._unusable = (self._unusable if message.append else 0) + page.unusable
        for model in page.items:
            if model.model_id in rows:
                continue
            label = model.model_id + (t("modelsscreen.gated") if model.gated else t("modelsscreen.private")
                                      if model.private else "")
            rows[model.model_id] = [label, _count(model.params), _count(model.downloads),
                                    (model.updated or "")[:10], model.license or ""]
        self._set_hub_rows(rows)
        shown = table.row_count
        if not shown:
            self._show_filters()
            self._show_message("empty", self._no_results_text())
        else:
            self._show_filters(self._found_text(shown, page) + (t("modelsscreen.more") if page.has_more else ""))
            self._show_message(None)

    def _found_text(self, shown: int, page: SearchPage) -> str:
        """"3 of 67 models"; under a size class what the count is out of: the models whose sizes were read
        (the hub counts all sizes: "1 of 67" said 67 of that size were found)."""
        return self._found_count(shown, page) + (t(plural_key("modelsscreen.found_unusable", self._unusable),
                                                   count=self._unusable, hub=HUB_LABELS.get(self.hub, self.hub))
                                                 if self._unusable else "")

    def _found_count(self, shown: int, page: SearchPage) -> str:
        size_class = self.query_state.size_class
        if size_class == "any":
            if shown == page.total:  # all the hub found: "1 model", not "1 of 1 models"
                return t(plural_key("modelsscreen.found_all", shown), count=shown)
            return t("modelsscreen.found", shown=shown, total=page.total)
        read = page.listed_through()
        size = t(f"modelsscreen.size.{size_class}")
        if read >= page.total:
            return t("modelsscreen.found_size_all", shown=shown, size=size, total=page.total)
        return t("modelsscreen.found_size", shown=shown, size=size, read=read, total=page.total)

    def _set_hub_rows(self, rows: dict[str, list[str]]) -> None:
        """The Hub tab lists ``rows`` now; the card of a model no longer listed goes with it."""
        self._hub_rows = rows
        self._fill_hub_table()
        if self.details is not None and self.details.summary.model_id not in rows:
            self._clear_card()

    def _fill_hub_table(self) -> None:
        """The results in the width the Hub tab has, the scrollbar's two cells kept free: the model, its
        parameters and downloads always, the model cut with an ellipsis where they need its room; the date and
        the licence only where they fit whole beside the full model name (the card has them). No number or
        date is ever cut."""
        table = self.query_one("#models-results", DataTable)
        labels = [t("modelsscreen.col_id"), t("modelsscreen.col_params"), t("modelsscreen.col_downloads"),
                  t("modelsscreen.col_updated"), t("modelsscreen.col_license")]
        rows = list(self._hub_rows.values())
        widths = [max([cell_len(label)] + [cell_len(row[index]) for row in rows]) for index, label in enumerate(labels)]
        width = self.query_one("#hub-left").size.width or max(40, self.size.width * 3 // 5)
        room = width - 2  # the vertical scrollbar
        id_full = min(widths[0], HUB_ID_MAX)
        shown = [0, 1, 2]
        used = id_full + 2 + widths[1] + 2 + widths[2] + 2
        for index in (3, 4):
            if used + widths[index] + 2 > room:
                break
            shown.append(index)
            used += widths[index] + 2
        id_width = max(HUB_ID_MIN, min(id_full, room - (used - id_full)))
        widths[0] = id_width
        cursor_key = self._highlighted_hub_key()
        table.clear(columns=True)
        for index in shown:
            table.add_column(truncate(labels[index], widths[index]), width=widths[index], key=HUB_COLUMNS[index])
        for model_id, row in self._hub_rows.items():
            cells = [truncate(row[0], id_width), *(row[index] for index in shown[1:])]
            table.add_row(*cells, key=model_id)
        if cursor_key in self._hub_rows:
            table.move_cursor(row=list(self._hub_rows).index(cursor_key))

    def _highlighted_hub_key(self) -> str | None:
        """The model id of the Hub tab's highlighted row; None when it lists none."""
        table = self.query_one("#models-results", DataTable)
        if not table.row_count or not 0 <= table.cursor_row < table.row_count:
            return None
        return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    def _clear_card(self) -> None:
        """No model open: the card says how to open one, and the keys that need one (d, f, p) go."""
        self.details = None
        self.query_one("#details-facts", Static).update(t("modelsscreen.pick_model"))
        self.query_one("#details-download", Static).update("")
        self.query_one("#details-card", Markdown).update("")
        self.refresh_bindings()
        self._refresh_download()

    @on(Input.Submitted, "#models-search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        self.query_state = replace(self.query_state, text=event.value.strip())
        event.stop()
        # After this event is done with the input: focusing now would be undone by its own handling.
        self.call_after_refresh(self._focus_list)
        self.run_search(force=True)  # asked for in so many words: ask the hub even if it was out of reach

    def on_key(self, event: Any) -> None:
        if event.key == "escape" and isinstance(self.focused, Input):
            self._focus_list()
            event.stop()

    @on(DataTable.RowHighlighted, "#models-results")
    def _maybe_next_page(self, event: DataTable.RowHighlighted) -> None:
        table = event.data_table
        # The card is the highlighted row's: another row highlighted, it goes (Enter opens that one).
        if self.details is not None and self._highlighted_hub_key() != self.details.summary.model_id:
            self._clear_card()
        if (self.page is not None and self.page.has_more and not self.searching
                and event.cursor_row >= table.row_count - 1):
            self.query_state = replace(self.query_state, page=self.page.page + 1)
            self.run_search(append=True)

    # --- details -----------------------------------------------------------------------------------
    @on(DataTable.RowSelected, "#models-results")
    def _open_details(self, event: DataTable.RowSelected) -> None:
        model_id = str(event.row_key.value)
        self.query_one("#details-facts", Static).update(t("modelsscreen.loading_details", model=model_id))
        self.query_one("#details-card", Markdown).update("")
        self._details_worker(self.hub, model_id)

    def _box(self) -> Any:
        """This box's GPUs and what other processes hold on them (``core.plan.HardwareTarget``), for the fit."""
        from core.plan.hardware import target_from_snapshot

        try:  # no NVML is said in the snapshot itself (no GPUs): estimates fall back to a reference GPU
            monitor = self.app.monitor  # type: ignore[attr-defined]
            snapshot = monitor.snapshot()
        except TunedeckError:  # a fake-GPU recording that cannot be read: the GPUs screen says so
            return None
        except Exception as exc:  # unexpected: the error modal and the log, and the reference GPU
            report_unexpected(self.app, exc, "models.box_gpus")
            return None
        return target_from_snapshot(snapshot)

    @work(thread=True, exclusive=True, group="hub-details", exit_on_error=False)
    def _details_worker(self, hub: str, model_id: str) -> None:
        from core.hub.problems import describe_error
        from core.hub.source import open_hub

        endpoint = ""
        try:
            source = open_hub(hub)
            endpoint = source.endpoint
            details = source.details(model_id)
        except (TunedeckError, OSError) as exc:  # a HubError, a network or disk error: said on screen
            self.post_message(DetailsDone(model_id, None, "", describe_error(exc, hub, endpoint), hub=hub))
            return
        except Exception as exc:  # an SDK surprise: said on screen too, and the error modal and log
            report_unexpected(self.app, exc, "models.details")
            self.post_message(DetailsDone(model_id, None, "", describe_error(exc, hub, endpoint), hub=hub))
            return
        params = None
        if details.config is not None:
            from core.estimate import ArchitectureError
            from core.hub.facts import model_facts

            try:
                params = model_facts(details.config).params
            except (ArchitectureError, TypeError, ValueError):
                pass
        self.post_message(DetailsDone(model_id, details, self._facts_text(details), None, params, hub))

    def _config_lines(self, config: dict[str, Any], name: str) -> list[str]:
        """The facts of a config.json and how its training fits this box (in a worker: the estimate is pure
        but not free); what cannot be read is said in their place."""
        from core.estimate import ArchitectureError
        from core.hub.facts import DEFAULT_BATCH, DEFAULT_SEQ_LEN, REFERENCE_GPU, fit_on_box, model_facts

        lines: list[str] = []
        try:
            facts = model_facts(config, name=name)
            rows = fit_on_box(config, self._box(), name=name)
        except ArchitectureError as exc:
            return [f"[$warning]{_plain(str(exc))}[/]"]
        except (TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:  # a config.json with odd values
            return [f"[$warning]{type(exc).__name__}: {_plain(str(exc))}[/]"]
        lines += ["", f"[b]{t('modelsscreen.facts_title')}[/]", t(
            "modelsscreen.fact_line", architecture=facts.architecture, params=_count(facts.params),
            layers=facts.layers, hidden=facts.hidden_size, heads=facts.heads, kv=facts.kv_heads,
            vocab=facts.vocab_size, context=facts.context_length or "?", dtype=facts.dtype or "?")]
        title = "modelsscreen.fit_title_reference" if rows and rows[0].reference else "modelsscreen.fit_title"
        gpu = REFERENCE_GPU if not rows or rows[0].reference else rows[0].gpu
        lines += ["", f"[b]{t(title, gpu=gpu, batch=DEFAULT_BATCH, seq=DEFAULT_SEQ_LEN)}[/]"]
        for row in rows:
            lines.append(t("modelsscreen.fit_row", method=row.method, peak=row.peak_gib,
                           capacity=row.capacity_gib, verdict=t(f"modelsscreen.verdict.{row.verdict}",
                                                                 free=row.free_gib or 0.0,
                                                                 usable=row.usable_gib or 0.0)))
        return lines

    def _facts_text(self, details: ModelDetails) -> str:
        """The facts, fit and files block (built in the worker: the estimate is pure but not free)."""
        summary = details.summary
        lines = [f"[b $primary]{_plain(summary.model_id)}[/]",
                 f"{HUB_LABELS[summary.hub]} · {_count(summary.downloads)} ↓ · {summary.likes} ♥ · "
                 f"{(summary.updated or '')[:10]} · {summary.license or UNKNOWN}"]
        if details.config is not None:
            lines += self._config_lines(details.config, summary.model_id)
        for note in details.notes:
            lines.append(f"[$warning]{_plain(note)}[/]")
        lines += ["", f"[b]{t('modelsscreen.files_title', count=len(details.files), size=human_bytes(details.total_size))}[/]"]
        for item in details.files[:40]:
            lines.append(f"{human_bytes(item.size):>10}  {_plain(item.path)}")
        lines += ["", f"[$foreground-muted]{t('modelsscreen.wizard_hint')}[/]"]
        return "\n".join(lines)

    def on_details_done(self, message: DetailsDone) -> None:
        if message.hub != self.hub or self._highlighted_hub_key() != message.model_id:
            return  # the cursor, the list or the hub moved on while it was read: not the row's card
        facts = self.query_one("#details-facts", Static)
        if message.problem is not None:
            if message.problem.offline:
                self.reachability.failed(message.problem)
            facts.update(self._problem_text(message.problem))
            return
        self.details = message.details
        facts.update(message.facts)
        self._show_download_choice()
        self.refresh_bindings()
        self._refresh_download()  # "d resumes it" when this is the stopped download's model
        if message.params is not None and message.model_id in self._hub_rows:
            # The name's guess gives way to the count from config.json (the columns fitted to it again).
            self._hub_rows[message.model_id][1] = _count(message.params)
            self._fill_hub_table()
        assert message.details is not None
        self.query_one("#details-card", Markdown).update(message.details.readme)

    # --- downloads ---------------------------------------------------------------------------------
    def _reattach(self) -> None:
        """The line takes the download to show (``_download_to_show``), read in the poll's worker."""
        self.job_dir = None
        self._picks += 1
        self._refresh_download()

    @staticmethod
    def _download_to_show() -> Any | None:
        """A running download first; else the newest one, so how it ended shows (not one that failed in a
        folder no longer in use, its model whole in the cache of now, nor a finished one whose folder is gone)."""
        from core.hub.download import list_downloads
        from core.hub.local import superseded_download

        downloads = list_downloads()
        return next((d for d in downloads if d.active), None) or \
            next((d for d in downloads if not superseded_download(d)), None)

    def _include(self) -> list[str] | None:
        return ["*"] if self.all_files else None

    def _show_download_choice(self) -> None:
        """What ``d`` would fetch: the files, their size, and what is skipped."""
        from core.hub.file_selection import select_files

        target = self.query_one("#details-download", Static)
        if self.details is None:
            target.update("")
            return
        chosen, skipped = select_files(self.details.files, self._include())
        line = t("modelsscreen.download_choice", count=len(chosen), size=human_bytes(sum(f.size for f in chosen)))
        if skipped:
            line += " " + t("modelsscreen.download_skips", count=len(skipped),
                            names=", ".join(f.path for f in skipped[:4]))
        target.update(_plain(line))

    def action_toggle_files(self) -> None:
        self.all_files = not self.all_files
        self._show_download_choice()

    def action_download(self) -> None:
        if self.tab == "local":
            model = self._selected_local()
            target = self._resumable(model)
            if target is not None and _running(target):
                return  # under way: the download line shows it, c cancels it
            if target is not None:
                hub, model_id, record = target
                self._resume_worker(hub, model_id, record.job_dir if record is not None else None)
            elif model is not None and _is_incomplete(model):
                self.notify(self._resume_how(model), severity="warning", timeout=15)
            return
        if self.details is None:
            self.notify(t("modelsscreen.no_model"), severity="warning")
            return
        self._download_worker(self.hub, self.details, self._include())

    def _resumable(self, model: Any) -> tuple[str, str, Any] | None:
        """(hub, id, download record or None) that ``d`` resumes for a Local row: a download not finished,
        by its record (hub, id and file choice; it may have failed before config.json came), else a hub
        cache's folder by its name beside a config.json (what ``models list`` would resume). None for
        anything else: a whole model, a bundled one, a stray folder or one of the user's."""
        if not _is_incomplete(model):
            return None
        from core.hub.local import download_of

        record = download_of(model, self.local_downloads)
        if record is not None and record.hub in HUB_LABELS:
            return record.hub, record.model_id, record
        if model.has_config and model.source in HUB_LABELS:
            return model.source, model.model_id, None
        return None

    @work(thread=True, exclusive=True, group="hub-download", exit_on_error=False)
    def _resume_worker(self, hub: str, model_id: str, job_dir: Path | None) -> None:
        """Start again the download of ``model_id`` from the Local tab: the hub's listing asked afresh (the
        endpoint and token of now), the files its record fetches (the choice it was started with); with no
        record, one weight format, as the Hub tab's ``d``. The files already here are kept."""
        from core.hub.download import check_disk, plan_download, recorded_files, start_download
        from core.hub.errors import HubError
        from core.hub.source import open_hub
        from core.hub.tokens import hub_token

        try:
            source = open_hub(hub)
            details = source.details(model_id)
            plan = plan_download(source, details, paths=recorded_files(job_dir) if job_dir is not None else None)
            check_disk(plan, advice="app")
            started = start_download(plan, hub_token(hub))
        except HubError as exc:
            self.post_message(DownloadStarted(None, str(exc)))
            return
        self.post_message(DownloadStarted(started, None, model_id))

    @work(thread=True, exclusive=True, group="hub-download", exit_on_error=False)
    def _download_worker(self, hub: str, details: ModelDetails, include: list[str] | None) -> None:
        """``d`` on the Hub tab, as ``tunedeck models download`` does it: a model whole on disk is said so (a
        downloader started that fetched nothing, "Downloading … in the background"); a download of it already
        running is joined and said so (its files go on: "f", all files, was dropped without a word)."""
        from core.hub.download import (
            check_disk,
            job_dir_for,
            plan_download,
            read_status,
            start_or_join_download,
        )
        from core.hub.errors import HubError
        from core.hub.source import open_hub
        from core.hub.tokens import hub_token

        model_id = details.summary.model_id
        try:
            source = open_hub(hub)
            plan = plan_download(source, details, include)
            earlier = read_status(job_dir_for(hub, plan.model_id))
            if plan.complete() and (earlier is None or earlier.status == "done"):
                self.post_message(DownloadStarted(None, None, model_id, already=plan.target_dir))
                return
            check_disk(plan, advice="app")
            job_dir, started = start_or_join_download(plan, hub_token(hub))
        except HubError as exc:
            self.post_message(DownloadStarted(None, str(exc)))
            return
        self.post_message(DownloadStarted(job_dir, None, model_id, joined=not started))

    def on_download_started(self, message: DownloadStarted) -> None:
        if message.error is not None:
            self.notify(message.error, severity="error", timeout=10)
            return
        if message.already is not None:
            self.notify(t("modelsscreen.download_already", model=message.model_id, path=str(message.already)))
            return
        self.job_dir = message.job_dir
        self._picks += 1
        if message.joined:
            self.notify(t("modelsscreen.download_joined", model=message.model_id), severity="warning", timeout=10)
        else:
            self.notify(t("modelsscreen.download_started", model=message.model_id))
        self._refresh_download()

    def _refresh_download(self) -> None:
        """The download line brought up to date. Its state is read in a worker, every half second and after
        each change here: with no download running that lists every download record (a home on a slow or
        network disk held the frame); one poll at a time, another asked meanwhile runs when it ends."""
        if self._polling:
            self._poll_again = True
            return
        self._polling = True
        self._poll_download(self.job_dir, self._picks)

    @work(thread=True, group="download-poll", exit_on_error=False)
    def _poll_download(self, asked: Path | None, picks: int) -> None:
        """One poll; its answer is always posted, an error too: a poll that raised and posted nothing left
        ``_polling`` set, and the line never changed again (a record read half written once froze it for good)."""
        try:
            job_dir, status = self._read_download(asked)
        except Exception as exc:  # any error of one read: said once (on_download_polled), the next poll reads again
            self.post_message(DownloadPolled(asked, asked, None, error=exc, picks=picks))
            return
        self.post_message(DownloadPolled(asked, job_dir, status, picks=picks))

    def _read_download(self, asked: Path | None) -> tuple[Path | None, Any | None]:
        from core.hub.download import list_downloads, read_status

        job_dir = asked
        status = read_status(job_dir) if job_dir is not None else None
        if job_dir is None:  # none picked yet (the screen opened, a model deleted): the one to show
            status = self._download_to_show()
            job_dir = status.job_dir if status is not None else None
        elif status is None or not status.active:
            # A download started since (from a terminal: `tunedeck models download`) takes the line: it followed
            # only the one picked on opening, and "No download" (or the last one's end) stayed while one ran.
            running = next((d for d in list_downloads() if d.active), None)
            if running is not None:
                job_dir, status = running.job_dir, running
            elif status is not None and status.target_gone:
                # Its folder deleted by hand (rm -rf) while the screen was open: "downloaded to" a folder that is
                # not there stayed on the line. The newest other download takes it, or none.
                status = self._download_to_show()
                job_dir = status.job_dir if status is not None else None
        return job_dir, status

    def on_download_polled(self, message: DownloadPolled) -> None:
        self._polling = False
        failed_before, self._poll_failed = self._poll_failed, message.error is not None
        if message.error is not None:  # the line stays as last read; the next half-second poll reads again
            if not failed_before:  # said once, not every half second while the record stays unreadable
                from tui.screens.error_modal import report_unexpected

                report_unexpected(self.app, message.error, "models.poll_download")
        elif message.asked == self.job_dir and message.picks == self._picks:
            # else d picked another meanwhile (or the same one again, started anew: a poll of before could
            # hand the line to another download it found running): the poll asked below reads it
            self.job_dir = message.job_dir
            self._show_download(message.status)
        else:
            self._poll_again = True
        if self._poll_again:
            self._poll_again = False
            self._refresh_download()

    def _show_download(self, status: Any | None) -> None:
        line = self.query_one("#download-line", Static)
        bar = self.query_one("#download-bar", ProgressBar)
        active = status is not None and status.active
        if active != self.download_active:
            self.download_active = active
            self.refresh_bindings()
        at = None if status is None else (status.job_dir, status.status, status.files_done)
        if at != self._listed_at:
            self._listed_at = at
            if self.tab == "local" and status is not None:
                # The model the download fills, listed again as it goes: at its end whole (or still not); as it
                # starts, and each file it finishes, incomplete and its size on disk. Read at its end only, a
                # model deleted and downloaded again from a shell stayed listed whole, old size and date.
                self._list_local()
        failed = (getattr(self.line_status, "status", None) in EXPLAINED_STATES,
                  getattr(status, "status", None) in EXPLAINED_STATES)
        self.line_status = status
        if failed[0] != failed[1]:
            self.refresh_bindings()  # e (why it failed) while the line shows a failed download
        bar.display = status is not None
        if status is None:
            line.update(f"[$foreground-muted]{t('modelsscreen.no_download')}[/]")
            return
        bar.update(total=max(1, status.bytes_total), progress=status.bytes_done)
        line.update(_plain(self._download_text(status, line.content_size.width or self.size.width - 2)))

    def _resumes_here(self, status: Any) -> bool:
        """Whether ``d`` now resumes ``status``'s download: its model is the one open, on its hub, or the
        Local tab's highlighted row is its folder."""
        if self.tab == "local":
            target = self._resumable(self._selected_local())
            return target is not None and (target[0], target[1]) == (status.hub, status.model_id)
        return (self.tab == "hub" and self.details is not None and status.hub == self.hub
                and status.model_id == self.details.summary.model_id)

    def _download_text(self, status: Any, width: int) -> str:
        """The download line in ``width`` cells: whole parts dropped from the end, a path cut in its middle.
        "d resumes it" only while ``d`` would: the stopped model open on its hub; else which hub it is on."""
        done, total = human_bytes(status.bytes_done), human_bytes(status.bytes_total)
        if status.retrying:  # the link dropped: the rate and ETA of before are not live
            return _line_of_model("modelsscreen.download_retrying", status.model_id, width, done=done, total=total,
                                  attempt=status.retry_attempt, reason=status.retry_reason or "",
                                  file=status.current_file or "")
        if status.active and status.verifying:  # whole, its checksum read: no byte comes, and none is missing
            return _line_of_model("modelsscreen.download_verifying", status.model_id, width, done=done, total=total,
                                  file=status.current_file or "")
        stalled = status.stalled_s()
        if stalled is not None:  # no byte for a while: the speed and ETA of before are not live
            return _line_of_model("modelsscreen.download_stalled", status.model_id, width, done=done, total=total,
                                  seconds=int(stalled), file=status.current_file or "")
        if status.active:
            # The one duration format, as `tunedeck models download` prints it: "%M:%S" read an ETA of 1:05:00 as 05:00.
            return _line_of_model("modelsscreen.download_line", status.model_id, width, done=done, total=total,
                                  rate=human_bytes(status.rate_bps), eta=format_duration(status.eta_s), file=status.current_file or "")
        if status.status == "done":
            model = _model_in_line("modelsscreen.download_status.done", status.model_id, width, reserve=16, path="")
            room = width - cell_len(t("modelsscreen.download_status.done", model=model, path=""))
            return truncate(t("modelsscreen.download_status.done", model=model,
                              path=_ellipsize_middle(str(status.target_dir), max(room, 12))), width)
        if status.status in ("cancelled", "interrupted") and not self._resumes_here(status):
            return _line_of_model("modelsscreen.download_stopped_elsewhere", status.model_id, width,
                                  hub=HUB_LABELS.get(status.hub, status.hub), done=done, total=total)
        return _line_of_model(f"modelsscreen.download_status.{status.status}", status.model_id, width,
                              path=str(status.target_dir), error=status.error or "", done=done, total=total)

    def _failed_download(self) -> Any | None:
        """The failed download ``e`` explains: on the Local tab the highlighted row's, else the one the
        download line shows; None when neither failed."""
        if self.tab == "local" and _is_incomplete(self._selected_local()):
            from core.hub.local import download_of

            record = download_of(self._selected_local(), self.local_downloads)
            if record is not None and record.status in EXPLAINED_STATES:
                return record
        status = self.line_status
        return status if status is not None and status.status in EXPLAINED_STATES else None

    def action_why_failed(self) -> None:
        """The whole reason a download failed (the download line and the Local details have room for its start)."""
        from tui.widgets.text_modal import TextModal

        failed = self._failed_download()
        if failed is not None:
            title = "modelsscreen.why_title_unreadable" if failed.status == "unreadable" else "modelsscreen.why_title"
            self.app.push_screen(TextModal(t(title, model=failed.model_id),
                                           failed.error or failed.status))

    def action_cancel_download(self) -> None:
        self._cancel_worker(self.job_dir)

    @work(thread=True, group="hub-cancel", exit_on_error=False)
    def _cancel_worker(self, job_dir: Path | None) -> None:
        """``c``: the record read and the cancel asked off the UI thread (a record that would not read held it)."""
        from core.hub.download import cancel_download, read_status

        status = read_status(job_dir) if job_dir is not None else None
        if status is None or not cancel_download(status.job_dir):
            self.app.call_from_thread(self.notify, t("modelsscreen.no_download"), severity="warning")
            return
        self.app.call_from_thread(self.notify, t("modelsscreen.cancel_sent", model=status.model_id))

    # --- local tab ---------------------------------------------------------------------------------
    def action_tab(self, tab: str, focus_list: bool = True) -> None:
        self.tab = tab
        self.query_one("#models-tabs", ContentSwitcher).current = f"{tab}-tab"
        self._show_filters(self._filters_extra)
        if tab == "local":
            self.query_one("#local-models", DataTable).focus()
            self._list_local()
        elif focus_list:
            self._focus_list()
        self.refresh_bindings()

    @work(thread=True, exclusive=True, group="hub-local", exit_on_error=False)
    def _list_local(self) -> None:
        from core.hub.download import list_downloads
        from core.hub.local import bundled_models, list_local_models, user_model_dirs

        models = list_local_models(user_model_dirs(self.app.settings))  # type: ignore[attr-defined]
        self.post_message(LocalListed(models, bundled_models(), list_downloads()))

    def _selected_local(self) -> Any | None:
        """The Local tab's highlighted row: a LocalModel on disk or a BundledModel; None if there is none."""
        if not self.is_mounted:
            return None
        table = self.query_one("#local-models", DataTable)
        if not self.local_rows or not 0 <= table.cursor_row < len(self.local_rows):
            return None
        return self.local_rows[table.cursor_row]

    @on(DataTable.RowHighlighted, "#local-models")
    def _local_highlighted(self, event: DataTable.RowHighlighted) -> None:
        # The details are the highlighted row's: another row highlighted, they go (Enter shows its own), as
        # the Hub tab's card does. They had stayed, saying "d resumes… x deletes the folder" of a model
        # other than the one d and x act on.
        if self._local_details_of is not None and self._local_details_of != _local_key(self._selected_local()):
            self._hide_local_details()
        self.refresh_bindings()  # delete is for a model on disk, not a bundled one
        self._refresh_download()  # "d resumes it" while the row is the stopped download's folder

    def on_local_listed(self, message: LocalListed) -> None:
        highlighted = _local_key(self._selected_local())  # the same model stays highlighted, wherever it moves
        self.local_models = message.models
        self.local_downloads = message.downloads
        self.local_rows = [*message.models, *message.bundled]
        rows = []
        for model in message.models:
            used = time.strftime("%Y-%m-%d", time.localtime(model.last_used)) if model.last_used else UNKNOWN
            # A download that failed or stopped (no config.json, .part files, no weights) is no model yet:
            # said where its last use would be (never used: it is not whole), not after its name, which
            # keeps the cells it needs (" (incomplete)" beside it cut "Qwen/Qwen2.5-7B-Instruct" at 80
            # columns). Enter says why and how to resume.
            if not _local_complete(model):
                used = t("modelsscreen.incomplete")
            rows.append((model.model_id, model.source, human_bytes(model.size_bytes), used, str(model.path)))
        for bundled in message.bundled:
            # Where a bundled model sits inside the install says nothing; what it is good for does.
            rows.append((bundled.name, t(f"modelsscreen.source.{bundled.kind}"), UNKNOWN, UNKNOWN,
                         t(f"modelsscreen.bundled_note.{bundled.kind}")))
        self._local_table_rows = rows
        keys = [_local_key(row) for row in self.local_rows]
        self._fill_local_table(keys.index(highlighted) if highlighted in keys else None)
        if self._local_details_of is not None:  # a download that ended, a model deleted: its details again
            shown = self._selected_local()
            if shown is not None and _local_key(shown) == self._local_details_of:
                self._local_facts_worker(shown)
            else:
                self._hide_local_details()
        # Whole models and unfinished downloads counted apart, as `tunedeck models list` lists them: a cancelled
        # download alone read "1 model on disk" where the CLI said "No models on disk".
        whole = [model for model in message.models if _local_complete(model)]
        partial = [model for model in message.models if not _local_complete(model)]
        on_disk = (t(plural_key("modelsscreen.local_count", len(whole)), count=len(whole),
                     size=human_bytes(sum(model.size_bytes for model in whole)))
                   if whole else t("modelsscreen.local_none_finished" if partial else "modelsscreen.local_none"))
        if partial:
            on_disk += " · " + t(plural_key("modelsscreen.local_incomplete", len(partial)), count=len(partial),
                                 size=human_bytes(sum(model.size_bytes for model in partial)))
        configs = sum(1 for bundled in message.bundled if bundled.kind == "config")
        self.query_one("#local-summary", Static).update(
            _plain(on_disk + "\n" + t("modelsscreen.local_bundled", count=configs)))
        self.refresh_bindings()

    def _fill_local_table(self, cursor: int | None = None) -> None:
        """The Local tab's rows in the screen's width, the scrollbar's two cells kept free: source, size and
        date whole, as wide as their content; the model name and the last column (a path, or what a bundled
        model is good for) share what is left, each cut with an ellipsis (a path's in its middle: its end names the
        model's folder), never a date or a size."""
        table = self.query_one("#local-models", DataTable)
        rows = self._local_table_rows
        labels = (t("modelsscreen.col_id"), t("modelsscreen.col_source"), t("modelsscreen.col_size"),
                  t("modelsscreen.col_used"), t("modelsscreen.col_path"))
        widths = [max([cell_len(label)] + [cell_len(row[index]) for row in rows]) for index, label in enumerate(labels)]
        widths[0] = min(widths[0], LOCAL_ID_MAX)
        # Each column takes two cells of padding; two more for the vertical scrollbar.
        room = self.size.width - sum(widths[1:4]) - 2 * len(labels) - 2
        if widths[0] + widths[-1] > room:
            last_min = min(widths[-1], LOCAL_LAST_MIN)
            widths[0] = max(min(widths[0], LOCAL_ID_MIN), min(widths[0], room - last_min))
            widths[-1] = max(6, min(widths[-1], room - widths[0]))
        paths = len(self.local_models)  # the rows on disk come first, their last cell a path: its middle gives way
        rows = [(truncate(row[0], widths[0]), *row[1:-1],
                 _ellipsize_middle(row[-1], widths[-1]) if index < paths else truncate(row[-1], widths[-1]))
                for index, row in enumerate(rows)]
        labels = (truncate(labels[0], widths[0]), *labels[1:-1], truncate(labels[-1], widths[-1]))
        cursor = table.cursor_row if cursor is None else cursor
        # Widths from the content: auto-sized columns of a table filled right after its tab appears can
        # stay at their header width.
        table.clear(columns=True)
        for label, width in zip(labels, widths, strict=True):
            table.add_column(label, width=width)
        for index, row in enumerate(rows):
            table.add_row(*row, key=str(index))
        if rows:
            table.move_cursor(row=min(max(cursor, 0), len(rows) - 1))

    def on_resize(self, event: Any) -> None:
        if self._local_table_rows:
            self._fill_local_table()
        self.call_after_refresh(self._fill_hub_table)  # once the Hub tab has its new width

    @on(DataTable.RowSelected, "#local-models")
    def _local_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a Local row: its facts and fit on this box, from its config.json (no hub asked)."""
        model = self._selected_local()
        if model is None:
            return
        details = self.query_one("#local-details", Static)
        details.display = True
        self._local_details_of = _local_key(model)
        name = getattr(model, "model_id", None) or model.name
        details.update(t("modelsscreen.loading_details", model=_plain(name)))
        self._local_facts_worker(model)

    def _hide_local_details(self) -> None:
        self._local_details_of = None
        self.query_one("#local-details", Static).display = False

    @work(thread=True, exclusive=True, group="hub-local-facts", exit_on_error=False)
    def _local_facts_worker(self, model: Any) -> None:
        import json

        from core.hub.local import BundledModel, bundled_config

        name = model.name if isinstance(model, BundledModel) else model.model_id
        lines = [f"[b $primary]{_plain(name)}[/]"]
        if not isinstance(model, BundledModel) and not _local_complete(model):
            from core.hub.local import download_of

            record = download_of(model, self.local_downloads)
            if record is not None and record.status in EXPLAINED_STATES:  # its start (two lines, wrapped); e shows it whole
                said = t("modelsscreen.unreadable_reason" if record.status == "unreadable"
                         else "modelsscreen.failed_reason", error="")  # a record unreadable says no failure
                room = max(20, (self.size.width - 2) * 3 // 2 - cell_len(said))
                lines.append(f"[$error]{_plain(said + truncate(record.error or record.status, room))}[/]")
            lines.append(f"[$warning]{_plain(self._resume_how(model))}[/]")
        try:
            if isinstance(model, BundledModel):
                config = bundled_config(model)
            else:
                found = [model.path / "config.json", *sorted(model.path.glob("snapshots/*/config.json")),
                         *sorted(model.path.glob("*/config.json"))]
                path = next((p for p in found if p.is_file()), None)
                if path is None:
                    self.post_message(LocalFacts("\n".join(lines), _local_key(model)))
                    return
                config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # unreadable or not JSON: said, with the file
            lines.append(f"[$warning]{_plain(str(exc))}[/]")
            self.post_message(LocalFacts("\n".join(lines), _local_key(model)))
            return
        lines += self._config_lines(config, name)
        self.post_message(LocalFacts("\n".join(lines), _local_key(model)))

    def _resume_how(self, model: Any) -> str:
        """What is missing from ``model`` (a LocalModel not complete) and how to finish or remove it."""
        weights = getattr(model, "weights", "complete")
        why = ("no_config" if not model.has_config else "partial" if weights == "partial"
               else "no_weights" if weights == "none" else "no_config")
        what = t(f"modelsscreen.incomplete_why.{why}", path=str(model.path))
        target = self._resumable(model)
        if target is not None and _running(target):
            return t("modelsscreen.resume_running", model=target[1], hub=HUB_LABELS[target[0]])
        if target is not None:
            return what + " " + t("modelsscreen.resume_key", model=target[1], hub=HUB_LABELS[target[0]])
        if model.source in HUB_LABELS:
            return what + " " + t("modelsscreen.resume_how", model=model.model_id, hub=HUB_LABELS[model.source])
        return what + " " + t("modelsscreen.resume_how_folder")

    def on_local_facts(self, message: LocalFacts) -> None:
        if message.path != self._local_details_of:
            return  # the facts of a row no longer shown (another highlighted since)
        details = self.query_one("#local-details", Static)
        details.display = True
        details.update(message.text)

    def action_delete_local(self) -> None:
        from core.hub.local import LocalModel

        model = self._selected_local() if self.tab == "local" else None
        if not isinstance(model, LocalModel):
            self.notify(t("modelsscreen.nothing_selected"), severity="warning")
            return
        self._delete_check_worker(model)  # a refusal is said in the dialog, not after a y

    @work(thread=True, exclusive=True, group="hub-delete-check", exit_on_error=False)
    def _delete_check_worker(self, model: Any) -> None:
        from core.hub.local import delete_blocker, user_model_dirs

        blocker = delete_blocker(model, user_model_dirs(self.app.settings))  # type: ignore[attr-defined]
        self.post_message(DeleteChecked(model, blocker.why if blocker is not None else ""))  # nothing tried yet

    def on_delete_checked(self, message: DeleteChecked) -> None:
        model = message.model
        if not self.is_current:
            return  # left (or a dialog opened) while the check ran: no dialog over another screen
        if message.refusal:  # no y to press for what would be refused: why, and the way out
            from tui.widgets.text_modal import TextModal

            self._list_local()  # the listing of now: a model deleted elsewhere leaves its row

            self.app.push_screen(TextModal(t("modelsscreen.delete_refused_title", model=model.model_id),
                                           message.refusal))
            return
        from tui.widgets.confirm import ConfirmScreen

        def answered(confirmed: bool | None) -> None:
            if confirmed:
                self._delete_worker(model)

        self.app.push_screen(ConfirmScreen(t("modelsscreen.delete_title", model=model.model_id),
                                           t("modelsscreen.delete_body", path=model.path,
                                             size=human_bytes(model.size_bytes))), answered)

    @work(thread=True, exclusive=True, group="hub-delete", exit_on_error=False)
    def _delete_worker(self, model: Any) -> None:
        from core.hub.local import delete_local_model, user_model_dirs

        try:
            freed = delete_local_model(model, user_model_dirs(self.app.settings))  # type: ignore[attr-defined]
        except (OSError, ValueError) as exc:
            self.app.call_from_thread(self.notify, t("modelsscreen.delete_failed", model=model.model_id, error=exc),
                                      severity="error")
            return
        self.app.call_from_thread(self.notify, t("modelsscreen.deleted", model=model.model_id,
                                                 size=human_bytes(freed)))
        # The download line no longer speaks of its download (stopped at 16%, d resumes it: there is nothing
        # left to resume; core removes its record too); the newest other download, if any, takes its place.
        # Its record read here, off the UI thread.
        from core.hub.download import read_status

        shown = self.job_dir
        status = read_status(shown) if shown is not None else None
        if shown is not None and (status is None or (not status.active and _download_of(status, model))):
            self.app.call_from_thread(self._forget_download, shown)
        self._list_local()

    def _forget_download(self, job_dir: Path) -> None:
        if self.job_dir == job_dir:  # the line still shows the deleted model's download
            self.job_dir = None
            self._reattach()

    # --- keys by state -----------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The hub's keys on the Hub tab only; download and its file choice once a model is open; plan in
        the wizard with a model open (Hub) or highlighted (Local); delete on a model on disk; cancel while
        a download runs. Refused here, they leave the footer, the help and the palette."""
        if action in HUB_TAB_ACTIONS:
            return self.tab == "hub"
        if action == "download" and self.tab == "local":
            # d resumes it; not while its download runs (d then offered "Resume" of a download under way)
            target = self._resumable(self._selected_local())
            return target is not None and not _running(target)
        if action in ("download", "toggle_files"):
            return self.tab == "hub" and self.details is not None
        if action == "wizard":  # not a download not finished: the wizard would plan on weights that are not there
            if self.tab == "hub":
                return self.details is not None
            return self._selected_local() is not None and not _is_incomplete(self._selected_local())
        if action == "delete_local":
            from core.hub.local import LocalModel

            return self.tab == "local" and isinstance(self._selected_local(), LocalModel)
        if action == "cancel_download":
            return self.download_active
        if action == "why_failed":
            return self._failed_download() is not None
        if action == "tab":
            return not parameters or parameters[0] != self.tab
        return True

    def footer_label(self, binding_id: str, description: str) -> str:
        """On the Local tab ``d`` resumes a download not finished: the footer says Resume."""
        if binding_id == "models.download" and self.tab == "local":
            return t("modelsscreen.key.resume")
        return description

    def footer_priority(self) -> tuple[str, ...]:
        """Offline, the ways on first (the Local tab, asking again, the other hub); else the search."""
        if self.tab == "local":
            return ("models.wizard", "models.download", "models.why", "models.delete", "models.tab_hub",
                    "models.refresh", "models.cancel")
        if self.message_kind == "problem":
            return ("models.tab_local", "models.refresh", "models.hub", "models.search", "models.cancel")
        return ("models.search", "models.hub", "models.download", "models.wizard", "models.why", "models.cancel")

    # --- filters and the rest ----------------------------------------------------------------------
    def action_focus_search(self) -> None:
        self.action_tab("hub", focus_list=False)
        # now, not after a refresh: see tui.widgets.burst_typing
        self.set_focus(self.query_one("#models-search", Input))

    def action_toggle_hub(self) -> None:
        self.hub = _cycle(HUBS, self.hub)
        self._clear_card()  # the card was the other hub's
        self._search_soon()

    def action_cycle_owner(self) -> None:
        self._set(owner=_cycle(OWNERS, self.query_state.owner))

    def action_cycle_task(self) -> None:
        self._set(task=_cycle(TASKS, self.query_state.task))

    def action_cycle_size(self) -> None:
        self._set(size_class=_cycle(SIZE_CLASSES, self.query_state.size_class))

    def action_cycle_sort(self) -> None:
        self._set(sort=_cycle(SORTS, self.query_state.sort))

    def _set(self, **changes: Any) -> None:
        self.query_state = replace(self.query_state, **changes)
        self._search_soon()

    def action_refresh(self) -> None:
        if self.tab == "local":
            self._list_local()
        else:
            self.run_search(force=True)

    def action_wizard(self) -> None:
        if self.tab == "local":
            from core.hub.local import wizard_model_name

            row = self._selected_local()
            if row is None:
                self.notify(t("modelsscreen.nothing_selected"), severity="warning")
                return
            model_id = wizard_model_name(row)
        elif self.details is None:
            self.notify(t("modelsscreen.no_model"), severity="warning")
            return
        else:
            model_id = self.details.summary.model_id
        self.app.wizard_model = model_id  # type: ignore[attr-defined]
        self.notify(t("modelsscreen.wizard_set", model=model_id))
        self.app.action_section("wizard")  # type: ignore[attr-defined]
