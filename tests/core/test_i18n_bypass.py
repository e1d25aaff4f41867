"""No user-facing text bypasses the catalogue: an AST scan of tui/ and the CLI commands finds no string
literal with letters handed straight to a sink that shows it (widgets, notifications, bindings, palette
commands, titles, CLI errors, prints, argparse help). f-string literal parts count too."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Rich/Textual markup ([b], [/], [$error], [bold red]) and str.format fields are not text to translate.
_MARKUP = re.compile(r"\[/?\$?[a-z][a-z0-9 _.$-]*\]|\[/\]")
_FIELD = re.compile(r"\{[^{}]*\}")

# Literal texts that may reach a sink untranslated, each with the reason. Compared after markup and
# format fields are removed and surrounding whitespace stripped.
ALLOWED = {
    "tunedeck": "the product's name",
    "GiB": "binary unit symbol, the same in every language",
    "MiB": "binary unit symbol",
    "W": "watt symbol",
    "°C": "degree Celsius symbol",
    "x": "multiplication sign in '8x H200', read the same in Chinese",
    "auto": "a configuration value the user types as is (gpus: auto, attn: auto)",
    "MB": "decimal unit symbol",
}
# Exact literal pieces (unstripped) allowed where a looser match would let real words through.
ALLOWED_PIECES = {
    " checkpoint-": "a checkpoint folder's name (checkpoint-500), shown as it is on disk",
    "RUN_DIR/merged": "a path template the user types",
}

# Call name -> which positional arguments are shown to the user (None = all of them).
POSITIONAL_SINKS: dict[str, tuple[int, ...] | None] = {
    "Static": (0,),
    "Label": (0,),
    "Button": (0,),
    "Tab": (0,),
    "TabPane": (0,),
    "Markdown": (0,),
    "notify": (0,),
    "update": (0,),
    "add_column": (0,),
    "add_columns": None,
    "Binding": (2,),
    "SystemCommand": (0, 1),
    "CliError": (0,),
    "print": None,
    "error": (0,),  # argparse's parser.error
    "Text": (0,),
    "add_row": None,
    "write": (0,),  # log widgets, sys.stderr
}
# Keyword arguments shown to the user, whatever the call.
KEYWORD_SINKS = {"help", "description", "title", "sub_title", "placeholder", "label", "tooltip", "epilog"}
# Attributes whose assigned value is shown.
ATTRIBUTE_SINKS = {"title", "sub_title", "border_title", "border_subtitle", "TITLE", "SUB_TITLE", "tooltip"}
# Calls that build text from their arguments (so their literal arguments are shown too).
TEXT_BUILDERS = {"Text", "assemble", "from_markup", "Content", "format", "join"}


@dataclass(frozen=True)
class Bypass:
    path: str
    line: int
    sink: str
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.sink} gets {self.text!r}"


def _name(func: ast.expr) -> str:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _literals(node: ast.expr | None):
    """The literal string pieces an expression contributes to the text it builds."""
    if node is None:
        return
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.JoinedStr):
        for part in node.values:
            if isinstance(part, ast.Constant):
                yield part.value
            elif isinstance(part, ast.FormattedValue):
                yield from _literals(part.value)
    elif isinstance(node, ast.BinOp):
        yield from _literals(node.left)
        yield from _literals(node.right)
    elif isinstance(node, ast.IfExp):
        yield from _literals(node.body)
        yield from _literals(node.orelse)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from _literals(value)
    elif isinstance(node, (ast.Tuple, ast.List)):
        for element in node.elts:
            yield from _literals(element)
    elif isinstance(node, ast.Call):
        name = _name(node.func)
        if name == "t":
            return  # a catalogue key, translated
        if name in TEXT_BUILDERS:
            if isinstance(node.func, ast.Attribute):
                yield from _literals(node.func.value)
            for arg in node.args:
                yield from _literals(arg)


def _has_words(text: str) -> bool:
    if text in ALLOWED_PIECES:
        return False
    bare = _FIELD.sub("", _MARKUP.sub("", text)).strip(" :·-()\n")
    if not any(ch.isalpha() for ch in bare):
        return False
    return bare not in ALLOWED


def scan(path: Path) -> list[Bypass]:
    relative = str(path.relative_to(ROOT))
    found: list[Bypass] = []

    def check(node: ast.expr | None, sink: str, line: int) -> None:
        for text in _literals(node):
            if _has_words(text):
                found.append(Bypass(relative, line, sink, text))

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Call):
            name = _name(node.func)
            positions = POSITIONAL_SINKS.get(name, ())
            for index, arg in enumerate(node.args):
                if positions is None or index in positions:
                    check(arg, f"{name}()", node.lineno)
            for keyword in node.keywords:
                if keyword.arg in KEYWORD_SINKS or (name == "Binding" and keyword.arg == "description"):
                    check(keyword.value, f"{name}({keyword.arg}=)", node.lineno)
                elif name == "t" and keyword.arg is not None:
                    # t("plan.memory", verdict="fits" if ok else "does not fit"): English inside a translation.
                    check(keyword.value, f"t(..., {keyword.arg}=)", node.lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                # self.title = …, or a class's TITLE = … (a plain local named title is not shown).
                attr = target.attr if isinstance(target, ast.Attribute) else target.id if isinstance(target, ast.Name) else ""
                if attr in ATTRIBUTE_SINKS and (isinstance(target, ast.Attribute) or attr.isupper()):
                    check(node.value, f"{attr} =", node.lineno)
    return found


def _sources() -> list[Path]:
    return sorted((ROOT / "tui").rglob("*.py")) + sorted((ROOT / "core").glob("*/commands.py")) + [ROOT / "core" / "cli.py"]


def test_no_user_text_bypasses_the_catalogue():
    bypasses = [bypass for path in _sources() for bypass in scan(path)]
    assert bypasses == [], "user-facing text outside core/i18n (use t('area.key')):\n" + "\n".join(map(str, bypasses))


def test_the_scan_catches_each_kind_of_bypass(tmp_path, monkeypatch):
    """The scanner itself: each sink form is caught, translated and symbolic text is not."""
    sample = tmp_path / "tui" / "sample.py"
    sample.parent.mkdir()
    sample.write_text(
        "from core.i18n import t\n"
        "Static('Hello')\n"                                   # 2: widget text
        "self.notify(f'Saved {path} now')\n"                  # 3: f-string literal part
        "Binding('q', 'quit', 'Quit')\n"                      # 4: binding description
        "Binding('q', 'quit', t('app.key.quit'))\n"           # 5: fine
        "self.sub_title = 'Run ' + run_id\n"                  # 6: title attribute, concatenation
        "parser.add_argument('--x', help='do things')\n"      # 7: argparse help
        "raise CliError(t('a.b', x=1), 2)\n"                  # 8: fine
        "bar.update(f'{used:.1f} GiB · {pct}%')\n"            # 9: fine: unit symbol, numbers
        "label.update('[b]' + t('x.y') + '[/]')\n"            # 10: fine: markup only
        "print(Text.assemble(('Loss', 'bold'), value))\n"     # 11: text builder
        "Input(placeholder='Search')\n"                        # 12: placeholder
        "t('plan.memory', verdict='fits' if ok else 'no')\n"   # 13: English parameter of a translation
        "t('plan.memory', peak=f'{peak:.1f}', unit='GiB')\n",  # 14: fine: a number and a unit
        encoding="utf-8",
    )
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    lines = sorted({bypass.line for bypass in scan(sample)})
    assert lines == [2, 3, 4, 6, 7, 11, 12, 13]
