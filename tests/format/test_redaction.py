"""Credentials out of locations (chute.format.redaction, through chute.format.storage), and
the storage layer's check of a location (#38 items 4, 5, 9): pure functions, no store."""

from __future__ import annotations

import logging

import pytest

from chute.errors import ChuteError
from chute.format import storage


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:TopSecretPw@h:5124/list.csv", "http://user:***@h:5124/list.csv"),
        ("https://ghp_TopSecret@h/a.tar", "https://***@h/a.tar"),  # a lone token as the user
        (
            "https://acct.blob.core.windows.net/c/list.csv?sv=2024-01-01&sp=r&sig=Top%2FSecret",
            "https://acct.blob.core.windows.net/c/list.csv?sv=2024-01-01&sp=r&sig=***",
        ),
        (
            "https://b.s3.amazonaws.com/x.npz?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            "&X-Amz-Credential=AKIATOPSECRET%2F20240101&X-Amz-Security-Token=TopSecret"
            "&X-Amz-Signature=TopSecret",
            "https://b.s3.amazonaws.com/x.npz?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            "&X-Amz-Credential=***&X-Amz-Security-Token=***&X-Amz-Signature=***",
        ),
        (
            "https://storage.googleapis.com/b/x.csv?X-Goog-Credential=TopSecret"
            "&X-Goog-Signature=TopSecret#frag",
            "https://storage.googleapis.com/b/x.csv?X-Goog-Credential=***&X-Goog-Signature=***#frag",
        ),
        (
            "https://h/x.csv?token=TopSecret&access_token=TopSecret&api_key=TopSecret&page=2",
            "https://h/x.csv?token=***&access_token=***&api_key=***&page=2",
        ),
        ("https://h/x.csv?key=TopSecret", "https://h/x.csv?key=***"),
        # nothing secret: as it was, including an Azure container where a user would be
        ("abfs://images@acct.dfs.core.windows.net/x", "abfs://images@acct.dfs.core.windows.net/x"),
        ("s3://bkt/src/list.csv", "s3://bkt/src/list.csv"),
        ("/data/user:pw@x/list.csv", "/data/user:pw@x/list.csv"),  # a local path is a name
        ("keras:mnist", "keras:mnist"),
    ],
)
def test_redact_keeps_the_place_and_drops_the_secrets(url, shown):
    assert storage.redact(url) == shown
    assert storage.redact(shown) == shown  # and again: nothing more goes


def test_redact_text_redacts_each_url_in_a_message():
    text = "Received: source='http://u:TopSecret@h/a.csv', then 'https://h/b.csv?sig=TopSecret'"
    assert storage.redact_text(text) == (
        "Received: source='http://u:***@h/a.csv', then 'https://h/b.csv?sig=***'"
    )


def test_the_log_filter_redacts_a_location_given_as_an_argument(caplog):
    log = logging.getLogger("chute.test_redaction")
    log.addFilter(storage.LOG_FILTER)
    try:
        with caplog.at_level(logging.INFO, logger="chute.test_redaction"):
            log.info("%s: %d images", "http://u:TopSecret@h/list.csv", 3)
    finally:
        log.removeFilter(storage.LOG_FILTER)
    assert [r.getMessage() for r in caplog.records] == ["http://u:***@h/list.csv: 3 images"]


def test_an_error_raised_through_a_redacting_entry_point_is_redacted():
    @storage.redacting_errors
    def fails(source: str) -> None:
        raise FileNotFoundError(2, "No such file", source)

    with pytest.raises(FileNotFoundError) as raised:
        fails("http://u:TopSecret@h/list.csv?sig=TopSecret")
    assert "TopSecret" not in str(raised.value) and "u:***@h" in str(raised.value)


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("s3://", "must name a bucket: s3://BUCKET/PATH"),
        ("gs://", "must name a bucket: gs://BUCKET/PATH"),
        ("gs:///x", "must name a bucket"),
        ("az://", "must name a container"),
        ("memory://", "must name a path after 'memory://'"),
        ("file://", "must name a path after 'file://'"),
        ("s3:/bkt/x", "reads as a URL without its '//'"),
        ("gs:bkt", "reads as a URL without its '//'"),
        ("://x", "must be a local path or a URL"),
        ("", "must be a path or a URL"),
    ],
)
def test_a_location_that_names_no_place_is_refused_naming_the_argument(path, says):
    with pytest.raises(ChuteError, match=r"^`output` ") as raised:
        storage.check_location(path, "output")
    assert says in str(raised.value) and f"Received: output={path!r}" in str(raised.value)


def test_a_refused_location_is_shown_without_its_credentials():
    with pytest.raises(ChuteError) as raised:
        storage.check_location("http://u:TopSecret@", "source")
    assert "TopSecret" not in str(raised.value)


@pytest.mark.parametrize(
    "path", ["s3://bkt", "s3://bkt/ds/", "gs://b/x", "ram://x", "memory://x", "out", "C:\\out"]
)
def test_a_location_that_names_a_place_passes(path):
    assert storage.check_location(path, "output") == path


@pytest.mark.parametrize(
    ("path", "folder", "inside"),
    [
        ("s3://bkt/src/out", "s3://bkt/src", True),
        ("s3://bkt/src", "s3://bkt/src/", True),
        ("s3://bkt//src/out/", "s3://bkt/src", True),
        ("s3a://bkt/src/out", "s3://bkt/src", True),
        ("gcs://bkt/src/out", "gs://bkt/src", True),
        ("s3://bkt/src-out", "s3://bkt/src", False),
        ("s3://other/src/out", "s3://bkt/src", False),
        ("gs://bkt/src/out", "s3://bkt/src", False),
        ("src/out", "s3://bkt/src", False),
    ],
)
def test_same_or_inside_compares_normalised_locations(path, folder, inside):
    assert storage.same_or_inside(path, folder) is inside


def test_same_or_inside_resolves_local_paths(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "src")
    assert storage.same_or_inside(str(tmp_path / "link" / "out"), str(tmp_path / "src"))
    assert not storage.same_or_inside(str(tmp_path / "srcx"), str(tmp_path / "src"))
