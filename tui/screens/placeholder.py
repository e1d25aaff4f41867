"""Sections whose screens later issues fill: they say what will be there and what works already."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from core.i18n import t


class PlaceholderScreen(Screen[None]):
    def __init__(self, section: str, commands: str) -> None:
        super().__init__(name=section)
        self.section = section
        self.commands = commands

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(classes="placeholder"):
            yield Static(t(f"placeholder.{self.section}"), classes="placeholder-text")
            yield Static(t("placeholder.headless", commands=self.commands), classes="placeholder-hint")
        yield Footer()

    def on_screen_resume(self) -> None:
        self.title = t("app.title")
        self.sub_title = t(f"app.mode.{self.section}")
