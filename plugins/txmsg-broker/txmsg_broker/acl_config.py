"""``plain_acl.yml`` as RocketMQ 4.9.x reads it (``txmsg broker --acl FILE``).

Same keys and meanings as 4.9.8's ``PlainPermissionManager``/``Permission``/``RemoteAddressStrategyFactory``::

    globalWhiteRemoteAddresses: [10.10.103.*, 192.168.0.*]   # these addresses need no keys at all
    accounts:
      - accessKey: RocketMQ            # > 6 characters, like secretKey
        secretKey: 12345678
        whiteRemoteAddress:            # from here this account needs no signature
        admin: false                   # admin: may create topics (UPDATE_AND_CREATE_TOPIC ...)
        defaultTopicPerm: DENY         # DENY | PUB | SUB | PUB|SUB; missing = DENY
        defaultGroupPerm: SUB
        topicPerms: [topicA=DENY, topicB=PUB|SUB, topicC=SUB]
        groupPerms: [groupA=DENY, groupB=PUB|SUB, groupC=SUB]   # checked as %RETRY%<group>

Address patterns: one address, ``a,b,c``, ``192.168.1.{1,2,3}``, ranges with ``*`` or ``a-b`` in one
octet (``192.168.*.*``, ``10.10.103.1-50``), ``*`` for everybody; IPv6 likewise.

Where we are stricter than 4.9.8, on purpose (an ACL file that silently means something else is
worse than one that does not start): an unknown permission word (4.9.8 reads it as DENY), an unknown
key (4.9.8 ignores it; a typo like ``topicPerm`` would drop every permission), a file with neither
accounts nor white addresses (4.9.8 then refuses every request) and a malformed address pattern are
startup errors that say what to fix. A repeated accessKey keeps the first account, as in 4.9.8.
Secret keys are never put in an error message.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DENY = 1
ANY = 2
PUB = 4
SUB = 8
PERM_WORDS = {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}
RETRY_PREFIX = "%RETRY%"
KEY_MIN_LENGTH = 6  # 4.9.8: "length should longer than 6", i.e. at least 7 characters

TOP_KEYS = ("globalWhiteRemoteAddresses", "accounts", "dataVersion")
ACCOUNT_KEYS = (
    "accessKey",
    "secretKey",
    "whiteRemoteAddress",
    "admin",
    "defaultTopicPerm",
    "defaultGroupPerm",
    "topicPerms",
    "groupPerms",
)

#: ``match(ip)`` of one address pattern; ``ip`` is the client's address without the port
AddressMatcher = Callable[[str], bool]


class AclConfigError(ValueError):
    """The ACL file cannot be used; the message names the file, the entry and what to write instead."""


@dataclass(frozen=True)
class Account:
    access_key: str
    secret_key: str = field(repr=False)
    white_remote_address: str = ""
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    #: topic -> perm, and ``%RETRY%<group>`` -> perm (4.9.8 keeps both in one map)
    resource_perms: dict[str, int] = field(default_factory=dict)
    address_matcher: AddressMatcher = field(default=lambda _ip: False, repr=False, compare=False)


@dataclass(frozen=True)
class AclConfig:
    path: Path
    accounts: dict[str, Account]
    global_white: tuple[tuple[str, AddressMatcher], ...] = ()

    def describe(self) -> str:
        admins = sum(1 for a in self.accounts.values() if a.admin)
        return (
            f"ACL enabled from {self.path}: {len(self.accounts)} account(s) ({admins} admin), "
            f"{len(self.global_white)} global white address pattern(s)"
        )


# --- loading -------------------------------------------------------------------------------------
def _yaml() -> Any:
    """PyYAML, imported only by brokers started with --acl (the ``acl`` extra)."""
    try:
        import yaml  # noqa: PLC0415 - optional: only --acl needs it
    except ImportError:
        raise AclConfigError(
            "--acl needs PyYAML: pip install 'txmsg-broker[acl]' (or pyyaml)"
        ) from None
    return yaml


def load_acl(path: str | Path) -> AclConfig:
    """Read and check ``path``; raises :class:`AclConfigError` saying what is wrong where."""
    yaml = _yaml()
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AclConfigError(f"cannot read the ACL file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise AclConfigError(f"the ACL file {path} is not UTF-8 text: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AclConfigError(f"the ACL file {path} is not valid YAML: {exc}") from None
    return parse_acl(data, path)


def parse_acl(data: Any, path: str | Path = "<acl>") -> AclConfig:
    """Build the configuration from already-parsed YAML (a mapping)."""
    path = Path(path)
    where = f"the ACL file {path}"
    if not isinstance(data, dict) or not data:
        raise AclConfigError(
            f"{where} has no 'accounts' and no 'globalWhiteRemoteAddresses': every request would be "
            "refused. Write at least one account (see distribution/conf/plain_acl.yml of RocketMQ 4.9)"
        )
    unknown = [str(k) for k in data if k not in TOP_KEYS]
    if unknown:
        raise AclConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(TOP_KEYS)}"
        )
    white_raw = data.get("globalWhiteRemoteAddresses") or []
    if not isinstance(white_raw, list):
        raise AclConfigError(
            f"{where}: globalWhiteRemoteAddresses must be a list of address patterns"
        )
    global_white = tuple(
        (str(p), address_matcher(_scalar(p), f"{where}: globalWhiteRemoteAddresses"))
        for p in white_raw
    )
    accounts_raw = data.get("accounts") or []
    if not isinstance(accounts_raw, list):
        raise AclConfigError(
            f"{where}: accounts must be a list of accounts (each with accessKey, secretKey, ...)"
        )
    accounts: dict[str, Account] = {}
    for index, raw in enumerate(accounts_raw):
        account = _account(raw, f"{where}: account #{index + 1}")
        accounts.setdefault(account.access_key, account)  # 4.9.8: the first definition wins
    if not accounts and not global_white:
        raise AclConfigError(
            f"{where} has no accounts and no globalWhiteRemoteAddresses: every request would be refused"
        )
    return AclConfig(path, accounts, global_white)


def _scalar(value: Any) -> str:
    """A YAML scalar as fastjson hands it to 4.9.8 (``secretKey: 12345678`` is the string "12345678")."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise AclConfigError(f"expected a single value, got {type(value).__name__} {value!r}")


def _account(raw: Any, where: str) -> Account:
    if not isinstance(raw, dict):
        raise AclConfigError(
            f"{where} must be a mapping with accessKey, secretKey, ...; got {raw!r}"
        )
    unknown = [str(k) for k in raw if k not in ACCOUNT_KEYS]
    try:
        access_key = _scalar(raw.get("accessKey"))
        where = f"{where} (accessKey {access_key!r})" if access_key else where
        if unknown:
            raise AclConfigError(
                f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(ACCOUNT_KEYS)}"
            )
        secret_key = _scalar(raw.get("secretKey"))
        if len(access_key) <= KEY_MIN_LENGTH or len(secret_key) <= KEY_MIN_LENGTH:
            raise AclConfigError(
                "accessKey and secretKey must both be set and longer than 6 characters (as in RocketMQ 4.9)"
            )
        white = _scalar(raw.get("whiteRemoteAddress")).strip()
        admin_raw = raw.get("admin", False)
        if admin_raw is None:
            admin_raw = False
        if not isinstance(admin_raw, bool) and _scalar(admin_raw).lower() not in ("true", "false"):
            raise AclConfigError(f"admin must be true or false, got {admin_raw!r}")
        admin = admin_raw if isinstance(admin_raw, bool) else _scalar(admin_raw).lower() == "true"
        perms: dict[str, int] = {}
        for key, prefix in (("groupPerms", RETRY_PREFIX), ("topicPerms", "")):
            entries = raw.get(key) or []
            if not isinstance(entries, list):
                raise AclConfigError(
                    f"{key} must be a list of 'name=PERM' entries, e.g. - topicA=PUB|SUB"
                )
            for entry in entries:
                name, perm = _resource(_scalar(entry), key)
                perms[prefix + name] = perm
        return Account(
            access_key=access_key,
            secret_key=secret_key,
            white_remote_address=white,
            admin=admin,
            default_topic_perm=parse_perm(_scalar(raw.get("defaultTopicPerm")), "defaultTopicPerm"),
            default_group_perm=parse_perm(_scalar(raw.get("defaultGroupPerm")), "defaultGroupPerm"),
            resource_perms=perms,
            address_matcher=address_matcher(white, "whiteRemoteAddress"),
        )
    except AclConfigError as exc:
        raise AclConfigError(f"{where}: {exc}") from None


def parse_perm(word: str, what: str) -> int:
    """``PUB``, ``SUB``, ``PUB|SUB``, ``SUB|PUB``, ``DENY``; empty = DENY (as 4.9.8)."""
    word = word.strip()
    if not word:
        return DENY
    perm = PERM_WORDS.get(word)
    if perm is None:
        raise AclConfigError(
            f"{what}: unknown permission {word!r}; use one of DENY, PUB, SUB, PUB|SUB, SUB|PUB "
            "(RocketMQ 4.9 would silently read it as DENY)"
        )
    return perm


def _resource(entry: str, key: str) -> tuple[str, int]:
    items = [
        part.strip() for part in entry.split("=") if part
    ]  # StringUtils.split drops empty parts
    if len(items) != 2 or not items[0]:
        raise AclConfigError(
            f"{key}: cannot read {entry!r}; the expected format is 'name=PERM', for example topicA=SUB"
        )
    return items[0], parse_perm(items[1], f"{key} entry {entry!r}")


def check_perm(needed: int, owned: int) -> bool:
    """4.9.8 ``Permission.checkPermission``."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


# --- address patterns (RemoteAddressStrategyFactory) ---------------------------------------------
def address_matcher(pattern: str, what: str = "address") -> AddressMatcher:
    """The matcher of one white-address pattern; raises :class:`AclConfigError` for a malformed one."""
    pattern = pattern.strip()
    if not pattern:
        return _never
    if pattern in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return _always
    try:
        if pattern.endswith("}"):
            return _braces(pattern)
        if "," in pattern:
            return _one_of([p for p in pattern.split(",") if p])
        if "*" in pattern or "-" in pattern:
            return _range(pattern)
        return _one_of([pattern])
    except (AclConfigError, ValueError, IndexError) as exc:
        raise AclConfigError(
            f"{what}: {pattern!r} is not an address pattern ({exc}); use an address, a,b,c, "
            "192.168.1.{1,2}, 192.168.*.* or 10.10.103.1-50"
        ) from None


def _never(_ip: str) -> bool:
    return False


def _always(_ip: str) -> bool:
    return True


def _normal(address: str) -> str:
    """The canonical text of a valid IPv4/IPv6 address; ValueError otherwise."""
    return str(ipaddress.ip_address(address.strip()))


def _one_of(addresses: list[str]) -> AddressMatcher:
    wanted = frozenset(_normal(a) for a in addresses)

    def match(ip: str) -> bool:
        try:
            return _normal(ip) in wanted
        except ValueError:
            return False

    return match


def _braces(pattern: str) -> AddressMatcher:
    head, _, tail = pattern.partition("{")
    if ":" in pattern:
        if not pattern.rsplit(":", maxsplit=1)[-1].startswith("{"):
            raise ValueError("the {...} list must be the last group")
    elif len([p for p in pattern.split(".") if p]) < 4 or not pattern.rsplit(".", maxsplit=1)[
        -1
    ].startswith("{"):
        raise ValueError("the {...} list must be the last of four octets")
    return _one_of([head + item for item in tail[:-1].split(",") if item])


def _range(pattern: str) -> AddressMatcher:
    """4.9.8 ``RangeRemoteAddressStrategy``: the first of octets 2-4 (IPv6: groups 2-8) that is ``*`` or
    ``a-b`` is the range; the octets before it must equal the client's, the ones after it are ignored."""
    if ":" in pattern:
        return _range_v6(pattern)
    parts = [p.strip() for p in pattern.split(".") if p]
    if len(parts) != 4:
        raise ValueError("an IPv4 range needs four octets")
    for index in (1, 2, 3):
        bounds = _bounds(parts[index], 255, 10)
        if bounds is not None:
            break
    else:
        raise ValueError("no octet is * or a range a-b")
    for part in parts[:index]:
        if not part.isdigit() or int(part) > 255:
            raise ValueError(f"octet {part!r} is not 0..255")
    head = parts[:index]
    start, end = bounds

    def match(ip: str) -> bool:
        octets = ip.split(".")
        if len(octets) != 4 or octets[:index] != head or not octets[index].isdigit():
            return False
        return start <= int(octets[index]) <= end

    return match


def _range_v6(pattern: str) -> AddressMatcher:
    groups = [g.strip() for g in pattern.split(":")]
    for index in range(1, len(groups)):
        bounds = _bounds(groups[index], 0xFFFF, 16)
        if bounds is not None:
            break
    else:
        raise ValueError("no group is * or a range a-b")
    head = [int(g, 16) for g in groups[:index]]  # ValueError for anything but hex groups
    start, end = bounds

    def match(ip: str) -> bool:
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False
        if address.version != 6:
            return False
        full = [int(g, 16) for g in address.exploded.split(":")]
        return full[:index] == head and start <= full[index] <= end

    return match


def _bounds(part: str, top: int, base: int) -> tuple[int, int] | None:
    if part == "*":
        return 0, top
    if "-" in part:
        if part.startswith("-"):
            raise ValueError(f"range {part!r} has no start")
        low, _, high = part.partition("-")
        start, end = int(low, base), int(high, base)
        if not (0 <= start <= end <= top):
            raise ValueError(f"range {part!r} is not within 0..{top} or starts after its end")
        return start, end
    return None


def check_acl_setting(path: Path, grpc_port: int | None) -> Path:
    """``BrokerConfig.acl``: the file must load now (a clear startup error, not a refusal per request),
    and it cannot be combined with the gRPC endpoint, which does not check it."""
    if grpc_port is not None:
        raise AclConfigError(
            "--acl guards the remoting port only: the RocketMQ 5 gRPC endpoint (--grpc-port) would let "
            "every client in without keys. Leave out --grpc-port, or --acl"
        )
    load_acl(path)
    return path


def write_acl(path: Path, data: Mapping[str, Any]) -> Path:
    """Write ``data`` (the plain_acl.yml structure) to ``path`` and return it (fixtures, the fuzz harness)."""
    path.write_text(_yaml().safe_dump(dict(data), sort_keys=False), encoding="utf-8")
    return path
