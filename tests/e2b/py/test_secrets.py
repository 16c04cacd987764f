"""The Secrets API with the unmodified e2b Python SDK (`e2b.Secret`): create, read, version,
page, destroy, the name and metadata rules, and that one team never sees another's. Values go
in and never come back out. Run by tests/e2b_sdk.rs against a gateway with two teams.
"""

from __future__ import annotations

import os
import uuid

import httpx
import pytest

from e2b import Secret, SecretException, SecretNotFoundException

API = os.environ["E2B_API_URL"].rstrip("/")
KEY_B = os.environ["E2B_OTHER_API_KEY"]
RUN = uuid.uuid4().hex[:8]


def name(n: str) -> str:
    return f"{n}-{RUN}"


@pytest.fixture
def made():
    names = []
    yield names
    for n in names:
        Secret.destroy(n)


def test_a_secret_is_written_versioned_and_never_read_back(made):
    value = f"sk-live-{uuid.uuid4().hex}"
    info = Secret.create(name("OpenAI"), value, metadata={"owner": "infra"})
    made.append(info.name)
    assert info.secret_id.startswith("sec_")
    assert info.name == name("openai"), "names are kept lowercased"
    assert info.version == 1 and info.metadata == {"owner": "infra"}
    by_id = Secret.get_info(info.secret_id)
    by_name = Secret.get_info(name("OPENAI"))
    assert by_id == by_name == info
    assert Secret.exists(info.name) and not Secret.exists(name("nothing"))

    again = Secret.update(info.secret_id, value + "-2")
    assert again.version == 2 and again.metadata == {"owner": "infra"}
    assert again.updated_at >= info.updated_at and again.created_at == info.created_at
    cleared = Secret.update(info.name, value + "-3", metadata={})
    assert cleared.version == 3 and cleared.metadata == {}

    # No read surface carries the value.
    headers = {"X-API-Key": os.environ["E2B_API_KEY"]}
    for path in ["/secrets", f"/secrets/{info.secret_id}", f"/secrets/{info.name}"]:
        body = httpx.get(f"{API}{path}", headers=headers).text
        assert value not in body and "value" not in body, body

    assert Secret.destroy(info.secret_id) is True
    made.clear()
    assert Secret.destroy(info.secret_id) is False
    with pytest.raises(SecretNotFoundException):
        Secret.get_info(info.name)
    with pytest.raises(SecretNotFoundException):
        Secret.update(info.name, "v")


def test_lists_page_by_name(made):
    for n in ["c", "a", "b"]:
        made.append(Secret.create(name(f"page-{n}"), "v").name)
    pages, seen = Secret.list(limit=2), []
    while pages.has_next:
        page = pages.next_items()
        assert len(page) <= 2
        seen.extend(s.name for s in page)
    ours = [s for s in seen if s.endswith(RUN) and s.startswith("page-")]
    assert ours == [name("page-a"), name("page-b"), name("page-c")], seen


def test_names_values_and_metadata_follow_the_rules(made):
    made.append(Secret.create(name("taken"), "v").name)
    with pytest.raises(SecretException) as e:
        Secret.create(name("TAKEN"), "v")
    assert "already exists" in str(e.value)
    for bad in ["has space", "dots.are.not", "sec_looks_like_an_id", "x" * 129]:
        with pytest.raises(SecretException) as e:
            Secret.create(bad, "v")
        assert "secret name" in str(e.value) or "characters" in str(e.value), str(e.value)
    with pytest.raises(SecretException):
        Secret.create(name("empty"), "")
    with pytest.raises(SecretException):
        Secret.create(name("meta"), "v", metadata={f"k{i}": "v" for i in range(33)})
    assert not Secret.exists(name("meta")) and not Secret.exists(name("empty"))


def test_teams_do_not_see_each_others_secrets(made):
    mine = Secret.create(name("shared-name"), "mine")
    made.append(mine.name)
    assert not Secret.exists(mine.name, api_key=KEY_B)
    assert not Secret.exists(mine.secret_id, api_key=KEY_B)
    assert Secret.destroy(mine.secret_id, api_key=KEY_B) is False
    theirs = Secret.create(name("shared-name"), "theirs", api_key=KEY_B)
    try:
        assert theirs.secret_id != mine.secret_id
        assert Secret.get_info(mine.name).secret_id == mine.secret_id
    finally:
        Secret.destroy(theirs.secret_id, api_key=KEY_B)
