"""Server-sent events read line by line, as the HTML standard's event-stream parser reads them:
``event:``, ``data:`` (several lines joined), ``id:`` (kept until another one comes), ``retry:``
(the reconnection delay, in ms); a line starting with ``:`` is a comment (a keep-alive); a blank
line ends an event, which is dispatched when it has data."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from controller.client.models import Event


@dataclass
class Parser:
    last_id: str | None = None
    retry_ms: int | None = None
    _name: str = ""
    _data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> Event | None:
        """One line (without its line ending); the event it completes, if any."""
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._name = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self.last_id = value or None
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> Event | None:
        name, data = self._name or "message", self._data
        self._name, self._data = "", []
        if not data:
            return None
        text = "\n".join(data)
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = text
        return Event(name, parsed, self.last_id)
