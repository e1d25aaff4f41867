"""Plain records of what a hub says about its models: search results, files, details."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HUBS = ("modelscope", "hf")
SORTS = ("downloads", "likes", "recent")
SIZE_CLASSES = ("any", "small", "medium", "large", "xl")
# Upper bounds (billions of parameters, exclusive) of each size class.
_SIZE_BOUNDS = {"small": (0.0, 3.0), "medium": (3.0, 15.0), "large": (15.0, 80.0), "xl": (80.0, float("inf"))}

_PARAMS_IN_NAME = re.compile(r"(?<![A-Za-z0-9.])(?:(\d+)x)?(\d+(?:\.\d+)?)([BbMm])(?![A-Za-z0-9])")


# A hub id: owner/name, each part starting with a letter or digit, then letters, digits, ".", "_", "-".
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def is_hub_id(text: str) -> bool:
    """Whether ``text`` can name a model on a hub (``Qwen/Qwen2.5-7B``): checked here, before any request,
    so that a typo or a path (``tiny``, ``../../etc``) is said to be one and never reaches a hub's URL."""
    return bool(_HUB_ID.fullmatch(text)) and ".." not in text


def usable_id(model_id: str) -> bool:
    """Whether a search result can be opened, downloaded and trained by its id: one ``is_hub_id``
    accepts. The hubs' ids are ASCII; a result whose id is not (a mirror's, a test server's) would be a
    dead end in the list (info and download refuse it), so the searches leave it out."""
    return is_hub_id(model_id)


def parameters_from_name(model_id: str) -> int | None:
    """The parameter count a model's name states (``Qwen2.5-7B`` -> 7e9, ``8x7B`` -> 56e9), if any."""
    name = model_id.rsplit("/", 1)[-1].replace("_", "-")
    best: int | None = None
    for match in _PARAMS_IN_NAME.finditer(name):
        experts = int(match.group(1) or 1)
        scale = 1e9 if match.group(3) in "Bb" else 1e6
        value = int(experts * float(match.group(2)) * scale)
        best = value if best is None else max(best, value)
    return best


def in_size_class(params: int | None, size_class: str) -> bool:
    """Whether ``params`` falls in ``size_class`` ("any" takes everything, unknown sizes only "any")."""
    if size_class == "any":
        return True
    if params is None:
        return False
    low, high = _SIZE_BOUNDS[size_class]
    return low * 1e9 <= params < high * 1e9


@dataclass(frozen=True)
class SearchQuery:
    """What the user asks a hub for."""

    text: str = ""
    owner: str = ""
    task: str = "text-generation"  # "" = any task
    size_class: str = "any"
    sort: str = "downloads"
    page: int = 1
    page_size: int = 20


@dataclass(frozen=True)
class ModelSummary:
    """One row of search results."""

    hub: str
    model_id: str
    downloads: int = 0
    likes: int = 0
    updated: str | None = None  # ISO date-time
    license: str | None = None
    tasks: tuple[str, ...] = ()
    params: int | None = None  # from the name; exact figures come from config.json in the details
    private: bool = False
    gated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "hub": self.hub, "id": self.model_id, "downloads": self.downloads, "likes": self.likes,
            "updated": self.updated, "license": self.license, "tasks": list(self.tasks),
            "params": self.params, "private": self.private, "gated": self.gated,
        }


@dataclass(frozen=True)
class SearchPage:
    items: tuple[ModelSummary, ...]
    total: int
    page: int
    page_size: int
    # results the hub listed that are left out of ``items``, their id being no hub id (``usable_id``): a count
    # of the items says why it falls short of what the hub listed
    unusable: int = 0

    @property
    def has_more(self) -> bool:
        return self.page * self.page_size < self.total

    def listed_through(self) -> int:
        """How many of the ``total`` the hub listed up to this page: under a size class, the models whose
        sizes were read (``items`` are those of the class), so what a count of the items is out of."""
        return min(self.page * self.page_size, self.total)


SIZE_SCAN_PAGES = 10  # the hub pages one search with a size class reads at most before it answers


def scan_for_size_class(query: SearchQuery, read_page: Callable[[int], SearchPage]) -> SearchPage:
    """The first page from ``query.page`` on that holds a model of ``query.size_class``, ``read_page(n)``
    giving hub page ``n`` with the others left out. The hubs have no size filter: read a page at a time,
    most pages of a popular query held none of a size class, and a first page without one said "no models
    match" of a search whose later pages had some. At most ``SIZE_SCAN_PAGES`` pages are read; the page
    returned is the last read, so the next page asked for goes on from there."""
    from dataclasses import replace

    page = read_page(query.page)
    unusable = page.unusable
    for _ in range(SIZE_SCAN_PAGES - 1):
        if query.size_class == "any" or page.items or not page.has_more:
            break
        page = read_page(page.page + 1)
        unusable += page.unusable
    return replace(page, unusable=unusable)


@dataclass(frozen=True)
class RepoFile:
    """A file of a model repository, with the size and hash the hub states."""

    path: str
    size: int
    sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class ModelDetails:
    """Everything the details pane shows about one model."""

    summary: ModelSummary
    files: tuple[RepoFile, ...]
    readme: str = ""
    config: dict[str, Any] | None = None
    revision: str = "master"
    notes: tuple[str, ...] = field(default=())  # e.g. "config.json could not be read"

    @property
    def total_size(self) -> int:
        return sum(item.size for item in self.files)
