"""Every code block of README.md and docs/ runs, on small generated data; the site builds.

The conventions (CONTRIBUTING.md, "The documentation"): each page's blocks run in order,
in one Python namespace, in a temporary folder of its own. ``python`` blocks are executed;
``bash`` blocks hold only ``chute ...`` commands (continued with ``\\``, optionally
preceded by ``VAR=value``), run in this process through ``chute.cli.main``; a block with
``title="NAME"`` is written to ``NAME``; ``text`` blocks are output, not code. A page names
the data it reads in ``<!-- docs-test: needs NAME ... -->`` (generated stand-ins under the
names the docs use, see ``DATA``) and may ask for a child process with an environment
(``<!-- docs-test: env KERAS_BACKEND=jax -->``). Every training runs one epoch. A block
that cannot run here has ``<!-- not run: reason -->`` on the line before it.

A small collector rather than pytest-examples or Sybil: those run each block alone
(pytest-examples) or need their own markup for shell sessions and shared set-up (Sybil),
while a page here is a sequence of steps (convert, then train, then predict) whose bash
commands must run in-process (a fresh process costs seconds of TensorFlow import each).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUNNABLE = {"python", "bash"}
NOT_CODE = {"text"}  # what a command prints, a diagram

_FENCE = re.compile(r"^```(\w*)(.*)$")
_NOT_RUN = re.compile(r"^<!-- not run: (.+) -->$")
_DIRECTIVE = re.compile(r"<!-- docs-test: (needs|env) (.+?) -->")
_TITLE = re.compile(r'title="([^"]+)"')


@dataclasses.dataclass
class Block:
    lang: str
    code: str
    line: int
    title: str | None = None
    not_run: str | None = None


@dataclasses.dataclass
class Page:
    path: Path
    blocks: list[Block]
    needs: list[str]
    env: dict[str, str]

    @property
    def name(self) -> str:
        return self.path.relative_to(ROOT).as_posix()

    def trains(self) -> bool:
        runnable = "\n".join(b.code for b in self.blocks if b.not_run is None)
        return bool(re.search(r"chute train (?!--help)|\.fit\(|chute\.train\(", runnable))


def parse(path: Path) -> Page:
    """The fenced blocks of a Markdown page, with the page's directives."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks, index = [], 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        end = index + 1
        while not lines[end].startswith("```"):
            end += 1
        before = _NOT_RUN.match(lines[index - 1]) if index else None
        title = _TITLE.search(match.group(2))
        blocks.append(
            Block(
                lang=match.group(1),
                code="\n".join(lines[index + 1 : end]) + "\n",
                line=index + 1,
                title=title.group(1) if title else None,
                not_run=before.group(1) if before else None,
            )
        )
        index = end + 1
    needs, env = [], {}
    for kind, value in _DIRECTIVE.findall("\n".join(lines)):
        if kind == "needs":
            needs += value.split()
        else:
            env.update(item.split("=", 1) for item in value.split())
    return Page(path, blocks, needs, env)


def one_epoch(code: str) -> str:
    """Every training in the docs runs one epoch here."""
    code = re.sub(r"(?<![\w-])(--epochs[ =])\d+", r"\g<1>1", code)
    code = re.sub(r"\bepochs=\d+", "epochs=1", code)
    return re.sub(r"(?m)^epochs = \d+$", "epochs = 1", code)


def commands(code: str) -> list[list[str]]:
    """A bash block's commands, continuation lines joined, comments dropped."""
    out = []
    for line in code.replace("\\\n", " ").split("\n"):
        words = shlex.split(line, comments=True)
        if words:
            out.append(words)
    return out


def run_page(page: Page, folder: Path) -> None:
    """Runs the page's blocks in order in ``folder`` (the current directory meanwhile)."""
    from helpers import run_here

    namespace: dict = {"__name__": "docs_page"}
    here = os.getcwd()
    os.chdir(folder)
    try:
        for block in page.blocks:
            if block.not_run is not None:
                continue
            where = f"{page.name}:{block.line}"
            code = one_epoch(block.code)
            if block.title:
                Path(block.title).write_text(code, encoding="utf-8")
            elif block.lang == "python":
                exec(compile(code, where, "exec"), namespace)
            elif block.lang == "bash":
                for words in commands(code):
                    env = {}
                    while "=" in words[0] and not words[0].startswith("-"):
                        name, value = words.pop(0).split("=", 1)
                        env[name] = value
                    saved = {name: os.environ.get(name) for name in env}
                    os.environ.update(env)
                    try:
                        result = run_here(*words[1:])
                    finally:
                        for name, value in saved.items():
                            if value is None:
                                os.environ.pop(name, None)
                            else:
                                os.environ[name] = value
                    assert result.returncode == 0, (
                        f"{where}: `{shlex.join(words)}` exited {result.returncode}\n"
                        f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
                    )
    finally:
        os.chdir(here)


# The data the docs name, generated small: what a page's `needs` copies into its folder.
def _glyphs(root: Path) -> None:
    import chute

    chute.make_sample_folder(root, num_classes=8, images_per_class=25, image_size=(75, 75))


def _glyph_zip(root: Path, data: Callable[[str], Path]) -> None:
    with zipfile.ZipFile(root, "w") as archive:
        source = data("Images_with_noise")
        for file in sorted(source.rglob("*.png")):
            archive.write(file, Path("Images_with_noise") / file.relative_to(source))


def _kn_shards(root: Path, data: Callable[[str], Path]) -> None:
    import chute

    chute.convert(
        data("Images_with_noise"),
        root,
        image_size=75,
        color_mode="grayscale",
        val_fraction=0.2,
        test_fraction=0.1,
    )


def _photos(root: Path) -> None:
    import chute

    chute.make_sample_folder(
        root,
        num_classes=5,
        images_per_class=20,
        image_size=(96, 128),
        color_mode="rgb",
        image_format="jpg",
    )


def _flowers_shards(root: Path, data: Callable[[str], Path]) -> None:
    import chute

    chute.convert(data("flowers"), root, shorter_side=256, val_fraction=0.1)


def _cifar(root: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    labels = np.tile(np.arange(10, dtype=np.uint8), 30)[:, None]
    # A class's images are brighter with its number: something to learn, in no time.
    images = rng.integers(0, 100, (300, 32, 32, 3)) + labels[:, :, None, None] * 15
    np.savez(
        root,
        x_train=images[:240].astype(np.uint8),
        y_train=labels[:240],
        x_test=images[240:].astype(np.uint8),
        y_test=labels[240:],
    )


def _tagged(root: Path) -> None:
    from PIL import Image

    import chute

    chute.make_sample_folder(root / "src", num_classes=4, images_per_class=10, color_mode="rgb")
    for number, file in enumerate(sorted((root / "src").rglob("*.png")), 1):
        Image.open(file).save(root / f"{number:03d}.jpg")
    shutil.rmtree(root / "src")


def _photo(root: Path, data: Callable[[str], Path]) -> None:
    shutil.copy(data("Images_with_noise") / "A" / "00000.png", root)


DATA: dict[str, Callable] = {
    "Images_with_noise": _glyphs,
    "Images_with_noise.zip": _glyph_zip,
    "kn-shards": _kn_shards,
    "flowers": _photos,
    "flowers-shards": _flowers_shards,
    "cifar.npz": _cifar,
    "img": _tagged,
    "photo.png": _photo,
}


@pytest.fixture(scope="module")
def docs_data(tmp_path_factory) -> Callable[[str], Path]:
    """``data(name)``: the generated stand-in for ``name``, made on first use."""
    root = tmp_path_factory.mktemp("docs-data")
    made: dict[str, Path] = {}

    def data(name: str) -> Path:
        if name not in made:
            build = DATA[name]
            path = root / name
            if name in ("img", "Images_with_noise", "flowers"):
                path.mkdir()
            if build.__code__.co_argcount == 2:
                build(path, data)
            else:
                build(path)
            made[name] = path
        return made[name]

    return data


def _lay_out(page: Page, folder: Path, data: Callable[[str], Path], request) -> None:
    """Copies what the page needs into its folder; a bucket is made on a local S3 server."""
    for name in page.needs:
        if name.startswith("s3://"):
            import boto3

            request.getfixturevalue("s3_endpoint")  # sets AWS_ENDPOINT_URL and credentials
            boto3.client("s3").create_bucket(Bucket=name.removeprefix("s3://"))
            continue
        source = data(name)
        target = folder / name
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy(source, target)


def _page_params() -> list:
    params = []
    for path in PAGES:
        page = parse(path)
        if not any(b.lang in RUNNABLE and b.not_run is None for b in page.blocks):
            continue
        marks = [pytest.mark.slow] if page.trains() or page.env else []
        params.append(pytest.param(page, id=page.name, marks=marks))
    return params


@pytest.mark.parametrize("page", _page_params())
def test_page_runs(page: Page, docs_data, tmp_path: Path, request) -> None:
    folder = tmp_path / "page"
    folder.mkdir()
    _lay_out(page, folder, docs_data, request)
    if page.name.endswith("recipes/pytorch.md"):
        pytest.importorskip("torch")
    if not page.env:
        run_page(page, folder)
        return
    # Another Keras backend: the page runs in a process of its own.
    child = subprocess.run(
        [sys.executable, __file__, str(page.path), str(folder)],
        env={**os.environ, **page.env, "PYTHONPATH": str(Path(__file__).parent)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-5000:]


def test_every_block_runs_or_says_why() -> None:
    """A block is run, is output (``text``) or a file (``title=``), or is marked not run;
    the marked ones are counted here so that they stay few."""
    not_run, unknown = [], []
    for path in PAGES:
        page = parse(path)
        for block in page.blocks:
            where = f"{page.name}:{block.line}"
            if block.not_run is not None:
                not_run.append(f"{where}: {block.not_run}")
            elif block.title is None and block.lang not in RUNNABLE | NOT_CODE:
                unknown.append(f"{where}: ```{block.lang}")
            elif block.lang == "bash":
                for words in commands(block.code):
                    while "=" in words[0] and not words[0].startswith("-"):
                        words.pop(0)
                    if words[0] != "chute":
                        unknown.append(f"{where}: {shlex.join(words)}")
    assert not unknown, "blocks the tests cannot run; mark them `<!-- not run: why -->`:\n" + (
        "\n".join(unknown)
    )
    assert len(not_run) <= 25, "\n".join(not_run)


def test_readme_links_resolve() -> None:
    """The README's links into the repository (docs/, CONTRIBUTING.md) name real files."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def _build_site(out: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stderr[-5000:]


def test_site_renders(tmp_path: Path) -> None:
    """The site builds with warnings as errors, every page's local assets exist, and the
    front page renders in headless Chromium (styled: Material's header colour is there)."""
    pytest.importorskip("mkdocs")
    site = tmp_path / "site"
    _build_site(site)
    for html in site.rglob("*.html"):
        if html.name == "404.html":  # the web server's page, linked from the site's root
            continue
        text = html.read_text(encoding="utf-8")
        for ref in re.findall(r'(?:href|src)="([^"#?]+)', text):
            if "://" not in ref and not ref.startswith(("mailto:", "data:")):
                assert (html.parent / ref).exists(), f"{html.relative_to(site)}: {ref}"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no Chromium here (apt-get install chromium): the screenshot is not taken")
    shot = screenshot(chromium, site / "index.html", tmp_path / "front.png")
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 900)
    header = image.crop((0, 0, 1280, 40)).getcolors(1280 * 40)
    assert max(header)[1] == (0x40, 0x51, 0xB5), "the header is not Material's indigo"
    assert len(image.getcolors(1280 * 900)) > 50, "the page looks blank"


def screenshot(chromium: str, page: Path, out: Path) -> Path:
    """A 1280x900 screenshot of ``page`` in headless Chromium, offline."""
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={out.parent / 'chromium-profile'}",
            "--window-size=1280,900",
            f"--screenshot={out}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


if __name__ == "__main__":  # a page with its own environment: python test_docs.py PAGE DIR
    run_page(parse(Path(sys.argv[1])), Path(sys.argv[2]))
