"""WebDataset tar shards as a source: ``{key}.jpg`` beside ``{key}.cls`` in ``.tar`` files.

A sample is the members sharing a key: the member's path up to the first dot
of its file name (``shard/00042.jpg`` and ``shard/00042.cls`` are sample
``shard/00042``), as WebDataset groups them. Each image member (``.jpg``,
``.jpeg``, ``.png``, ``.webp``, or any other image extension chute reads)
is an item, labelled by its sample's label member, the first of:

* ``{key}.cls``: a class index (``3``) or a class name;
* ``{key}.json``: an integer, a string, or an object with ``"label"`` (or
  ``"cls"``) holding one;
* ``{key}.txt``: a class index or a class name.

Integer labels become class names ``"0"``, ``"1"``, … sorted numerically (as a
CSV list's are); names are sorted. An image without a label member, or with a
label that does not parse, is rejected with the reason; so are truncated and
undecodable members. Hidden files and ``__MACOSX`` are skipped, as in folders.

The source is one ``.tar`` (compressed ones too: unpacked once, see
:mod:`.archives`), or a pattern naming shards: brace ranges and
lists (``shard-{000000..000099}.tar``, ``{train,extra}-0.tar``) and globs
(``shards/*.tar``). A single tar is read as WebDataset when at least half of
its images have a label member in their sample, otherwise as a class tree;
a pattern must name WebDataset shards. Shards form one pool, split by
``--val-fraction``; an item's key is ``{shard file}/{member}``.

Example:
    >>> import chute
    >>> chute.convert("data/shard-{000000..000003}.tar", "shards",
    ...               image_size=224)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re

from chute.errors import ChuteError
from chute.format import storage
from chute.image.files import IMAGE_EXTENSIONS
from chute.ingest.sources import archives, tars
from chute.ingest.sources import members as members_lib
from chute.ingest.sources.base import (
    LABEL_EXTENSIONS,
    LITTER,
    Item,
    MemberSource,
    ProgressFn,
    Source,
    class_names_of,
    make_scratch_dir,
)

IMAGE_EXTS = frozenset(ext[1:] for ext in IMAGE_EXTENSIONS)
# A cap on what a pattern expands to: a typo such as {0..99999999} must not fill memory.
MAX_SHARDS = 100_000
_BRACES = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")
_INTEGER = re.compile(r"-?\d+")


def is_pattern(source: str) -> bool:
    """Whether ``source`` has braces or glob characters (names shards, not one file).

    Example:
        >>> is_pattern("shard-{000000..000003}.tar"), is_pattern("data.tar")
        (True, False)
    """
    return bool(_BRACES.search(source)) or any(c in source for c in "*?[")


def expand_braces(pattern: str) -> list[str]:
    """``pattern`` with its brace ranges and lists expanded, in order.

    Ranges keep the zero padding of their bounds, as WebDataset's ``braceexpand`` does.

    Raises:
        ChuteError: a pattern naming more than :data:`MAX_SHARDS` paths.

    Example:
        >>> expand_braces("s-{08..10}.tar")
        ['s-08.tar', 's-09.tar', 's-10.tar']
        >>> expand_braces("{a,b}-{0..1}")
        ['a-0', 'a-1', 'b-0', 'b-1']
    """
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    head, body, tail = pattern[: match.start()], match[1], pattern[match.end() :]
    numbers = _RANGE.fullmatch(body)
    if numbers:
        first, last = int(numbers[1]), int(numbers[2])
        # A leading zero in either bound asks for zero padding, as braceexpand reads it.
        padded = any(len(n.lstrip("-")) > 1 and n.lstrip("-")[0] == "0" for n in numbers.groups())
        width = max(len(numbers[1]), len(numbers[2])) if padded else 0
        # Checked before the range is built: its size is known from the bounds.
        if abs(last - first) >= MAX_SHARDS:
            raise _too_many(pattern)
        step = 1 if last >= first else -1
        choices = [f"{n:0{width}d}" for n in range(first, last + step, step)]
    elif "," in body:
        choices = body.split(",")
    else:  # "{x}": no expansion, kept as written
        return [head + match[0] + rest for rest in expand_braces(tail)]
    out = [path for choice in choices for path in expand_braces(head + choice + tail)]
    if len(out) > MAX_SHARDS:
        raise _too_many(pattern)
    return out


def _too_many(pattern: str) -> ChuteError:
    return ChuteError(f"`source` names more than {MAX_SHARDS} shards. Received: source={pattern!r}")


def shard_paths(pattern: str) -> list[str]:
    """The shard files a pattern names, sorted; every named file must exist.

    Raises:
        ChuteError: a named shard is missing, a glob matches nothing, or a
            file is not a tar archive.
    """
    paths, missing = [], []
    for candidate in expand_braces(pattern):
        if any(c in candidate for c in "*?["):
            matches = storage.glob(candidate)
            paths += matches
            if not matches:
                missing.append(candidate)
        elif storage.exists(candidate):
            paths.append(candidate)
        else:
            missing.append(candidate)
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5])
        raise ChuteError(
            f"`source` names shards that do not exist ({shown}{', ...' if len(missing) > 5 else ''}"
            f"; {len(missing)} in all). Received: source={pattern!r}"
        )
    # A set: overlapping patterns ({a,b}* and a*) must not read a shard twice.
    paths = sorted(set(paths))
    others = [p for p in paths if not archives.is_tar(p)]
    if others:
        raise ChuteError(
            f"`source` must name WebDataset .tar shards ({', '.join(archives.TAR_SUFFIXES)}). "
            f"Received: source={pattern!r}, which names {others[0]!r}"
        )
    return paths


def scan_pattern(pattern: str, *, max_pixels: int, progress: ProgressFn | None = None) -> Source:
    """The samples of every shard a pattern names, as one :class:`Source`.

    Raises:
        ChuteError: see :func:`shard_paths`; a shard is unreadable, or holds no
            WebDataset samples.
    """
    paths = shard_paths(pattern)
    names = [storage.basename(p) for p in paths]
    if len(set(names)) < len(names):  # same file names in different folders: keep folders
        names = paths
    sizes = [storage.size(path) for path in paths]
    total = sum(sizes)
    temp_dir = make_scratch_dir()
    try:
        shards = []
        for number, (name, path) in enumerate(zip(names, paths, strict=True)):
            shown = None
            if progress is not None:  # one bar over every shard unpacked
                before = sum(sizes[:number])

                def shown(phase: str, done: int, _: int, before: int = before) -> None:
                    progress(phase, before + done, total)

            listing = tars.list_tar(path, max_pixels=max_pixels, progress=shown, temp_dir=temp_dir)
            if not looks_like(listing.files):
                raise ChuteError(
                    f"`source` must name WebDataset shards ({{key}}.jpg beside {{key}}.cls, "
                    f".txt or .json). Received: source={pattern!r}, whose {path!r} holds no "
                    "such samples"
                )
            shards.append((name, listing))
        return samples_source(pattern, shards, temp_dir, containers=paths)
    # BaseException: Ctrl-C mid-unpack must not leave the scratch folder behind.
    except BaseException:
        archives.remove(temp_dir)
        raise


def _samples(files: dict[str, archives.Entry]) -> dict[str, dict[str, archives.Entry]]:
    """Sample key -> {extension (lower case) -> entry}; hidden files and litter skipped."""
    samples: dict[str, dict[str, archives.Entry]] = {}
    for name, entry in files.items():
        parts = name.split("/")
        if any(part.startswith(".") or part in LITTER for part in parts):
            continue
        folder, _, base = name.rpartition("/")
        # Up to the first dot, as WebDataset groups: "x.seg.png" belongs to sample "x".
        stem, dot, extension = base.partition(".")
        if dot and stem:
            key = f"{folder}/{stem}" if folder else stem
            samples.setdefault(key, {})[extension.lower()] = entry
    return samples


def looks_like(files: dict[str, archives.Entry]) -> bool:
    """Whether a tar holds WebDataset samples: at least half of its images have a label
    member (``.cls``, ``.json``, ``.txt``) with the same key."""
    images = labelled = 0
    for extensions in _samples(files).values():
        count = sum(extension in IMAGE_EXTS for extension in extensions)
        images += count
        if any(extension in extensions for extension in LABEL_EXTENSIONS):
            labelled += count
    # At least half: a class tree with a few stray .txt notes is no WebDataset.
    return labelled > 0 and 2 * labelled >= images


def samples_source(
    location: str,
    shards: list[tuple[str, archives.Listing]],
    temp_dir: str | None = None,
    *,
    containers: list[str] | None = None,
) -> Source:
    """The items of WebDataset shards (``(shard name, listing)``, in order), sorted by key."""
    pending: list[tuple[str, str, members_lib.Member]] = []
    rejects: list[dict] = []
    for shard, listing in shards:
        temp_dir = temp_dir or listing.temp_dir
        rejects += [{"key": f"{shard}/{r['key']}", "reason": r["reason"]} for r in listing.rejects]
        for key, extensions in sorted(_samples(listing.files).items()):
            images = sorted(extension for extension in extensions if extension in IMAGE_EXTS)
            if not images:
                continue
            label, problem = _label(key, extensions)
            for extension in images:
                entry = extensions[extension]
                # The member's own reject (truncated, too large) comes before the label's.
                reason = entry.reject if entry.member is None else problem
                if reason is not None:
                    rejects.append({"key": f"{shard}/{entry.name}", "reason": reason})
                else:
                    pending.append((f"{shard}/{entry.name}", label, entry.member))
    # Sorted by key: the order never depends on how the shards were listed.
    pending.sort(key=lambda sample: sample[0])
    class_names = class_names_of([label for _, label, _ in pending])
    label_of = {name: i for i, name in enumerate(class_names)}
    items = [Item(key, label_of[label], None, None, i) for i, (key, label, _) in enumerate(pending)]
    return MemberSource(
        "webdataset",
        location,
        class_names,
        items,
        rejects=rejects,
        members=[member for *_, member in pending],
        containers=containers or [location],
        temp_dir=temp_dir,
    )


def _label(key: str, extensions: dict[str, archives.Entry]) -> tuple[str, str | None]:
    """A sample's label as a class name, or why there is none."""
    extension = next((e for e in LABEL_EXTENSIONS if e in extensions), None)
    if extension is None:
        return "", f"no label: the sample has no {key}.cls, .json or .txt member"
    name, entry = f"{key}.{extension}", extensions[extension]
    try:
        data = _small(entry)
        # utf-8-sig: a label file saved with a byte-order mark still reads as its text.
        text = data.decode("utf-8-sig").strip()
    except members_lib.MemberError as error:
        return "", f"label member {name}: {error}"
    except UnicodeDecodeError:
        return "", f"label member {name}: not UTF-8 text"
    if extension == "json":
        try:
            value = json.loads(text)
        except ValueError as error:
            return "", f"label member {name}: not JSON ({error})"
        if isinstance(value, dict):
            if "label" not in value and "cls" not in value:
                return "", f"label member {name}: a JSON object without 'label' or 'cls'"
            value = value["label"] if "label" in value else value["cls"]
        # bool is an int in Python: true is no label.
        if isinstance(value, bool) or not isinstance(value, int | str):
            return "", f"label member {name}: a label is an integer or a string, not {value!r}"
        text = str(value).strip()
    if not text:
        return "", f"label member {name} is empty"
    if _INTEGER.fullmatch(text):
        text = str(int(text))  # "007" and "7" are class 7
    return text, None


def _small(entry: archives.Entry) -> bytes:
    """The bytes of a label member (kept while unpacking, or read from the tar)."""
    if entry.data is not None:
        return entry.data
    if entry.member is None:
        raise members_lib.MemberError(entry.reject or "not a file")
    if entry.member.size > archives.SMALL_MEMBER:
        raise members_lib.MemberError(f"too large for a label ({entry.member.size} bytes)")
    return members_lib.read_member(entry.member, 0)  # 0 pixels: at most the 1 MiB slack
