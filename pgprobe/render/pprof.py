"""pprof profiles (gzipped profile.proto) from counted stacks.

The format of ``go tool pprof``, Grafana Pyroscope and Parca. The renderer is
generic: it takes stacks (frames innermost first, each a function and the
module it is in), one or more values per stack (what is counted: CPU samples
and nanoseconds, reads, off-CPU nanoseconds ...) and labels (pid,
backend_type, application_name, a wait event ...), and knows nothing of
probes or PostgreSQL.

What goes into the profile:

- ``sample_type``: one (type, unit) per value, e.g. ``samples/count`` and
  ``cpu/nanoseconds``; ``default_sample_type`` says which one pprof shows;
- one ``Mapping`` per module (the main one first, as the format wants), with
  ``has_functions`` set: the names are final, no client should try to
  symbolize again (pgprobe has no addresses left to give it: a frame is a
  function, not an instruction);
- one ``Function`` and one ``Location`` per distinct (module, function);
- ``Sample``: location ids leaf first, the values, the labels (strings, or
  numbers with a unit such as ``pid``);
- ``period_type``/``period`` (CPU: ``cpu/nanoseconds`` and 1e9 / Hz),
  ``time_nanos``, ``duration_nanos`` and ``comment`` lines (capture facts).

API: ``Frame(function, module)``, ``Sample(frames, values, labels)``,
``ValueType(type, unit)``, ``build(...) -> Profile message``,
``render(profile) -> bytes`` (gzipped), ``read(bytes) -> Profile message``.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgprobe.render.pprof_proto.profile_pb2 import Profile as Profile
LabelValue = str | int


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: a function and the file it is in ("" when unknown)."""

    function: str
    module: str = ""


@dataclass(frozen=True, slots=True)
class ValueType:
    """What a sample's value counts: ``ValueType("cpu", "nanoseconds")``."""

    type: str
    unit: str


@dataclass(frozen=True)
class Sample:
    """A stack (innermost frame first), its values (one per sample type), its labels."""

    frames: tuple[Frame, ...]
    values: tuple[int, ...]
    labels: Mapping[str, LabelValue] = field(default_factory=dict)


class _Strings:
    """The profile's string table: index 0 is "", each string once."""

    def __init__(self) -> None:
        self.table: list[str] = [""]
        self.index: dict[str, int] = {"": 0}

    def __call__(self, text: str) -> int:
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.table)
            self.table.append(text)
        return found


def build(
    samples: Iterable[Sample],
    sample_types: Sequence[ValueType],
    *,
    default_type: str | None = None,
    period_type: ValueType | None = None,
    period: int = 0,
    time_nanos: int = 0,
    duration_nanos: int = 0,
    comments: Sequence[str] = (),
    main_module: str = "",
) -> Profile:
    """The Profile message of counted stacks (see the module doc for what is written).

    Raises ValueError when a sample has not one value per sample type.
    """
    strings = _Strings()
    profile = _message()
    for vt in sample_types:
        profile.sample_type.add(type=strings(vt.type), unit=strings(vt.unit))
    if default_type is not None:
        if default_type not in {vt.type for vt in sample_types}:
            raise ValueError(f"default sample type {default_type!r} is not a sample type")
        profile.default_sample_type = strings(default_type)
    mappings: dict[str, int] = {}
    locations: dict[Frame, int] = {}

    def mapping_id(module: str) -> int:
        found = mappings.get(module)
        if found is None:
            found = mappings[module] = len(mappings) + 1
            profile.mapping.add(id=found, filename=strings(module), has_functions=True)
        return found

    def location_id(frame: Frame) -> int:
        found = locations.get(frame)
        if found is None:
            found = locations[frame] = len(locations) + 1
            # Function.filename is a source file in the spec; the module is the best
            # pgprobe knows, and it keeps two same-named functions of two files apart.
            profile.function.add(
                id=found,
                name=strings(frame.function),
                system_name=strings(frame.function),
                filename=strings(frame.module),
            )
            location = profile.location.add(id=found, mapping_id=mapping_id(frame.module))
            location.line.add(function_id=found)
        return found

    if main_module:
        mapping_id(main_module)  # mapping[0] is the main binary
    for sample in samples:
        if len(sample.values) != len(sample_types):
            raise ValueError(
                f"a sample has {len(sample.values)} values for {len(sample_types)} sample types"
            )
        out = profile.sample.add(
            location_id=[location_id(f) for f in sample.frames], value=sample.values
        )
        for key, value in sorted(sample.labels.items()):
            if isinstance(value, int):
                out.label.add(key=strings(key), num=value)
            elif value:  # an empty string says nothing: left out
                out.label.add(key=strings(key), str=strings(value))
    if period_type is not None:
        profile.period_type.type = strings(period_type.type)
        profile.period_type.unit = strings(period_type.unit)
        profile.period = period
    profile.time_nanos = time_nanos
    profile.duration_nanos = duration_nanos
    profile.comment.extend(strings(line) for line in comments)
    profile.string_table.extend(strings.table)
    return profile


def _message() -> Profile:
    """An empty Profile message. protobuf is imported here, when a profile is made: the
    commands that write none (most runs) do not pay its ~15 ms of import."""
    from pgprobe.render.pprof_proto import profile_pb2

    return profile_pb2.Profile()


def render(profile: Profile) -> bytes:
    """A built profile serialized and gzipped, as pprof files are stored and served."""
    # mtime=0: the same profile gives the same bytes.
    return gzip.compress(profile.SerializeToString(), mtime=0)


def read(data: bytes) -> Profile:
    """A Profile message from pprof bytes, gzipped or not (for tests and tools)."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    profile = _message()
    profile.ParseFromString(data)
    return profile
