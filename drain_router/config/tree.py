"""The settings tree: :class:`Config` holding the sections, and the order and headings in which the
CLI lists their settings.

The CLI generates its options from :func:`settings` (:func:`drain_router.config.flags.option`);
:func:`drain_router.config.build_config` validates raw values into a :class:`Config`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from drain_router.config import flags
from drain_router.config.admission import AdmissionSettings
from drain_router.config.flags import Flag
from drain_router.config.sections import AdminSettings, GrpcSettings, HealthSettings, LogSettings, ProxySettings
from drain_router.config.shutdown import DrainSettings


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Everything the router needs, validated. Build it with :func:`build_config`."""

    proxy: ProxySettings
    admin: AdminSettings = AdminSettings()
    grpc: GrpcSettings = GrpcSettings()
    admission: AdmissionSettings = AdmissionSettings()
    drain: DrainSettings = DrainSettings()
    health: HealthSettings = HealthSettings()
    log: LogSettings = LogSettings()

    def as_dict(self) -> dict[str, Any]:
        """The effective configuration as plain JSON-able data (for ``check`` and /admin/config)."""
        data = dataclasses.asdict(self)
        data["proxy"]["upstream"] = self.proxy.upstream.url
        data["grpc"]["upstream"] = None if self.grpc.upstream is None else self.grpc.upstream.url
        data["drain"]["deadline_secs"] = self.drain.deadline_secs()
        return data


#: The sections of :class:`Config`, in the order their flags are listed (the drain's probe settings
#: next to the first ones); each section's ``TITLE`` is its heading in ``serve --help``.
SECTIONS: dict[str, type[Any]] = {
    "drain": DrainSettings,
    "proxy": ProxySettings,
    "grpc": GrpcSettings,
    "admission": AdmissionSettings,
    "admin": AdminSettings,
    "health": HealthSettings,
    "log": LogSettings,
}

#: The flags every deployment sets first, listed before their sections: where the model server
#: is, how long to keep serving after SIGTERM, and the pod's grace that bounds both.
FIRST_NEEDED = ("upstream", "shutdown-drain-secs", "termination-grace-secs")
FIRST_NEEDED_TITLE = "Set these first"


def settings() -> Iterator[tuple[str, dataclasses.Field[Any], Flag]]:
    """Every setting: (section, dataclass field, flag), in the order the CLI lists them: the
    :data:`FIRST_NEEDED` ones, then the others by section."""
    every = [(section, field, flag) for section, cls in SECTIONS.items() for field, flag in flags.fields(cls)]
    yield from sorted((s for s in every if s[2].name in FIRST_NEEDED), key=lambda s: FIRST_NEEDED.index(s[2].name))
    yield from (s for s in every if s[2].name not in FIRST_NEEDED)


def help_title(section: str, flag: Flag) -> str:
    """The heading a flag is listed under in ``serve --help``."""
    return FIRST_NEEDED_TITLE if flag.name in FIRST_NEEDED else str(SECTIONS[section].TITLE)
