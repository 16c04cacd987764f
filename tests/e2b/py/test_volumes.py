"""Volumes with the unmodified e2b Python SDK (`e2b.Volume`): the control plane (create, list,
connect, destroy; names once per team; one team never sees another's), the volume content API
with the volume's token (files, directories, metadata, e2b's 404/409 rules, nothing outside
the volume), and `volume_mounts` sharing one volume between two running sandboxes, its files
kept after both are gone. Run by tests/e2b_sdk.rs against a gateway with two teams, and with the data plane (the mounts)
by tests/e2b_lifecycle.rs.
"""

from __future__ import annotations

import os
import uuid

import httpx
import pytest

# The content API is served by the gateway itself.
os.environ.setdefault("E2B_VOLUME_API_URL", os.environ["E2B_API_URL"])

from e2b import Sandbox, Volume  # noqa: E402
from e2b.exceptions import NotFoundException, SandboxException  # noqa: E402

API = os.environ["E2B_API_URL"].rstrip("/")
# Mounting needs the sandboxes' data plane: tests/e2b_lifecycle.rs runs these with it.
needs_data_plane = pytest.mark.skipif(
    not os.environ.get("E2B_SANDBOX_URL"),
    reason="needs a gateway data plane (E2B_SANDBOX_URL); run by tests/e2b_lifecycle.rs",
)
KEY_B = os.environ["E2B_OTHER_API_KEY"]
RUN = uuid.uuid4().hex[:8]


@pytest.fixture
def volume():
    v = Volume.create(f"work-{RUN}-{uuid.uuid4().hex[:4]}")
    yield v
    Volume.destroy(v.volume_id)


def test_volumes_are_named_once_per_team_and_private_to_it(volume):
    assert volume.volume_id.startswith("vol_") and volume.token
    names = [v.name for v in Volume.list()]
    assert volume.name in names
    info = Volume.get_info(volume.volume_id)
    assert (info.volume_id, info.name) == (volume.volume_id, volume.name)
    again = Volume.connect(volume.volume_id)
    assert again.token, "connect fetches a token"
    with pytest.raises(Exception) as e:
        Volume.create(volume.name)
    assert "already exists" in str(e.value)
    with pytest.raises(Exception):
        Volume.create("no spaces allowed")
    # Another team sees nothing of it, and cannot delete it.
    with pytest.raises(NotFoundException):
        Volume.get_info(volume.volume_id, api_key=KEY_B)
    assert volume.name not in [v.name for v in Volume.list(api_key=KEY_B)]
    assert Volume.destroy(volume.volume_id, api_key=KEY_B) is False
    assert Volume.get_info(volume.volume_id).name == volume.name


def test_the_content_api_works_on_files_within_the_volume(volume):
    d = volume.make_dir("/data/deep", force=True)
    assert d.type.value == "directory" and d.path == "/data/deep"
    with pytest.raises(Exception) as e:
        volume.make_dir("/data/deep")
    assert "409" in str(e.value) or "exists" in str(e.value)
    with pytest.raises(NotFoundException):
        volume.make_dir("/missing/parent/dir")
    st = volume.write_file("/data/hello.txt", "hello volume")
    assert st.type.value == "file" and st.size == 12 and st.uid == 1000
    assert volume.read_file("/data/hello.txt") == "hello volume"
    assert volume.read_file("/data/hello.txt", format="bytes") == b"hello volume"
    with pytest.raises(Exception) as e:
        volume.write_file("/data/hello.txt", "again")
    assert "409" in str(e.value) or "exists" in str(e.value)
    volume.write_file("/data/hello.txt", "replaced", force=True)
    assert volume.read_file("/data/hello.txt") == "replaced"
    listed = sorted(e.path for e in volume.list("/data"))
    assert listed == ["/data/deep", "/data/hello.txt"], listed
    assert volume.exists("/data/hello.txt") and not volume.exists("/data/nope")
    changed = volume.update_metadata("/data/hello.txt", mode=0o600)
    assert changed.mode == 0o600
    volume.remove("/data")
    assert not volume.exists("/data/hello.txt")
    with pytest.raises(NotFoundException):
        volume.read_file("/data/hello.txt")


def test_the_content_api_needs_the_volumes_own_token(volume):
    other = Volume.create(f"other-{RUN}")
    try:
        url = f"{API}/volumecontent/{volume.volume_id}/path"
        assert httpx.get(url, params={"path": "/"}).status_code == 401
        bad = {"Authorization": f"Bearer {other.token}"}
        assert httpx.get(url, params={"path": "/"}, headers=bad).status_code == 401
        good = {"Authorization": f"Bearer {volume.token}"}
        assert httpx.get(url, params={"path": "/"}, headers=good).status_code == 200
        # ".." never climbs out of the volume.
        r = httpx.get(f"{API}/volumecontent/{volume.volume_id}/file",
                      params={"path": "../../../../../../etc/passwd"}, headers=good)
        assert r.status_code == 400 and "root:" not in r.text, r.text
    finally:
        Volume.destroy(other.volume_id)


@needs_data_plane
def test_two_sandboxes_share_a_volume_and_its_files_outlive_them(volume):
    volume.write_file("/from-api.txt", "written through the API")
    mounts = {"/mnt/work": volume} if os.environ.get("E2B_SDK_VERSION") != "2.50.0" else {"/mnt/work": volume.name}
    a = Sandbox.create(volume_mounts=mounts)
    b = Sandbox.create(volume_mounts={"/mnt/work": volume.name})
    try:
        assert a.commands.run("cat /mnt/work/from-api.txt").stdout == "written through the API"
        # The sandbox's user owns the volume's top and what the API wrote.
        # (Python's stat: this gVisor refuses coreutils' statx flags.)
        owners = a.commands.run(
            "python3 -c 'import os, pwd, sys\n"
            "for p in sys.argv[1:]:\n"
            "    s = os.stat(p); print(pwd.getpwuid(s.st_uid).pw_name, oct(s.st_mode & 0o777)[2:])'"
            " /mnt/work /mnt/work/from-api.txt"
        ).stdout.split("\n")
        assert owners[0] == "user 755" and owners[1] == "user 644", owners
        a.commands.run("echo from a > /mnt/work/a.txt")
        assert b.commands.run("cat /mnt/work/a.txt").stdout == "from a\n"
        b.commands.run("mkdir -p /mnt/work/b && echo from b > /mnt/work/b/b.txt")
        assert a.commands.run("cat /mnt/work/b/b.txt").stdout == "from b\n"
        # No set-id programs or devices through a volume. (gVisor's mount table shows no such
        # flags: its processes run with no_new_privs, and the host's view of the volume that
        # runsc serves is nosuid and nodev.)
        if os.environ.get("SANDBOX_RUNTIME") != "gvisor":
            out = a.commands.run("grep ' /mnt/work ' /proc/self/mounts").stdout
            assert "nosuid" in out and "nodev" in out, out
        # A link a sandbox leaves in the volume does not lead the API out of it.
        a.commands.run("ln -s /etc/passwd /mnt/work/link && ln -s / /mnt/work/top")
        with pytest.raises(Exception):
            volume.read_file("/link")
        assert not volume.exists("/top/etc/passwd")
        assert a.get_info().volume_mounts == [{"name": volume.name, "path": "/mnt/work"}]
        # A filesystem-only pause and resume boots a fresh instance: the volume is mounted again.
        if os.environ.get("E2B_SDK_VERSION") == "2.50.0":
            a.pause(keep_memory=False)
        else:
            a.pause(mode="filesystem")
        a.connect()
        assert a.commands.run("cat /mnt/work/b/b.txt").stdout == "from b\n"
        a.commands.run("echo after resume > /mnt/work/resumed.txt")
        assert b.commands.run("cat /mnt/work/resumed.txt").stdout == "after resume\n"
    finally:
        a.kill()
        b.kill()
    assert volume.read_file("/a.txt") == "from a\n"
    assert volume.read_file("/b/b.txt") == "from b\n"
    assert volume.get_info("/b/b.txt").uid == 1000


def test_volume_mounts_are_checked():
    with pytest.raises(SandboxException) as e:
        Sandbox.create(volume_mounts={"/mnt/x": f"missing-{RUN}"})
    assert "400" in str(e.value) and "not found" in str(e.value), str(e.value)
    v = Volume.create(f"checked-{RUN}")
    try:
        with pytest.raises(SandboxException) as e:
            Sandbox.create(volume_mounts={"relative/path": v.name})
        assert "400" in str(e.value), str(e.value)
        # Another team's volume is not one of this team's.
        with pytest.raises(SandboxException) as e:
            Sandbox.create(volume_mounts={"/mnt/x": v.name}, api_key=KEY_B)
        assert "not found" in str(e.value), str(e.value)
    finally:
        Volume.destroy(v.volume_id)
