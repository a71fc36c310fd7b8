"""data/download.py against a loopback HTTP server and hostile archives.

Nothing here reaches the internet: every URL is http://127.0.0.1:<port>.
"""

import dataclasses
import hashlib
import http.server
import io
import os
import pathlib
import stat
import tarfile
import threading
import zipfile

import pytest

from tests.helpers import ROOT, load_data_script
from tf_resnet.config.datasets import Archive
from tf_resnet.errors import DataError

download = load_data_script("download")

FOLDER = "cifar-10-batches-bin"
FILES = {
    f"{FOLDER}/data_batch_1.bin": os.urandom(40_000),
    f"{FOLDER}/test_batch.bin": os.urandom(30_000),
    f"{FOLDER}/batches.meta.txt": b"airplane\nautomobile\n",
}


def _tar_gz(members):
    """tar.gz bytes from `(TarInfo, data or None)` pairs."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return buffer.getvalue()


def _regular_tar_members():
    return [(tarfile.TarInfo(name), data) for name, data in FILES.items()]


def _zip(entries):
    """zip bytes from `(ZipInfo or name, data)` pairs."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for entry, data in entries:
            bundle.writestr(entry, data)
    return buffer.getvalue()


def _md5(data):
    return hashlib.md5(data).hexdigest()


class _Server:
    """Loopback HTTP server with Range support that records each request."""

    def __init__(self):
        self.files = {}
        self.honour_range = True
        self.drop_next_after = None  # Close the next answer after N bytes.
        self.requests = []  # (path, Range header or None)
        self.bytes_sent = 0
        self._httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), self._handler_class()
        )
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()

    def url(self, name):
        return f"http://127.0.0.1:{self._httpd.server_port}/{name}"

    def close(self):
        self._httpd.shutdown()
        self._httpd.server_close()

    def _handler_class(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                del args

            def do_GET(self):  # noqa: N802 (http.server's name)
                body = server.files.get(self.path.lstrip("/"))
                range_header = self.headers.get("Range")
                server.requests.append((self.path, range_header))
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                if range_header and server.honour_range:
                    start = int(range_header[len("bytes=") : -1])
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header(
                        "Content-Range",
                        f"bytes {start}-{len(body) - 1}/{len(body)}",
                    )
                else:
                    self.send_response(200)
                payload = body[start:]
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if server.drop_next_after is not None:
                    payload = payload[: server.drop_next_after]
                    server.drop_next_after = None
                # Counted before writing: the client may return (and the test
                # read this) as soon as the last byte arrives.
                server.bytes_sent += len(payload)
                self.wfile.write(payload)

        return Handler


@pytest.fixture
def server():
    instance = _Server()
    yield instance
    instance.close()


@pytest.fixture
def fake_cifar10(server, monkeypatch):
    """Serves a small tar.gz in the CIFAR-10 layout; returns its bytes.

    The registry entry keeps an unreachable URL, so only `--url` can work.
    """
    body = _tar_gz(_regular_tar_members())
    server.files["mirror/cifar-10-binary.tar.gz"] = body
    spec = Archive(
        "http://127.0.0.1:9/cifar-10-binary.tar.gz", _md5(body), FOLDER
    )
    monkeypatch.setitem(download.ARCHIVES, "cifar10", {"binary": spec})
    return body


def _assert_unpacked(target, files):
    for name, data in files.items():
        path = pathlib.Path(target).parent / name
        assert path.read_bytes() == data, name


def test_cli_downloads_verifies_unpacks_then_does_nothing(
    server, fake_cifar10, tmp_path, capsys
):
    out = tmp_path / "datasets"
    argv = [
        "--dataset=cifar10",
        f"--output_dir={out}",
        f"--url={server.url('mirror/cifar-10-binary.tar.gz')}",
    ]
    download.main(argv)
    target = out / FOLDER
    assert capsys.readouterr().out.strip() == str(target)
    _assert_unpacked(target, FILES)
    # Only the dataset folder is left: no archive, .part or staging dir.
    assert sorted(os.listdir(out)) == [FOLDER]
    assert len(server.requests) == 1

    download.main(argv)  # Second run: already complete, no request.
    assert len(server.requests) == 1
    assert "already downloaded and verified" in capsys.readouterr().err


def test_zip_archive_with_keep_archive(server, tmp_path, monkeypatch):
    files = {
        "tiny-imagenet-200/wnids.txt": b"n01443537\n",
        "tiny-imagenet-200/train/n01443537/images/a.JPEG": os.urandom(5000),
    }
    body = _zip(files.items())
    server.files["tiny.zip"] = body
    spec = Archive(
        server.url("tiny-imagenet-200.zip"), _md5(body), "tiny-imagenet-200"
    )
    monkeypatch.setitem(download.ARCHIVES, "tinyimagenet", {"jpeg": spec})
    target = download.prepare(
        "tinyimagenet",
        str(tmp_path),
        url=server.url("tiny.zip"),
        keep_archive=True,
    )
    _assert_unpacked(target, files)
    archive = tmp_path / "tiny-imagenet-200.zip"
    assert download.file_md5(archive) == _md5(body)


def test_resume_requests_only_the_missing_bytes(server, tmp_path, capsys):
    body = os.urandom(300_000)
    server.files["blob.bin"] = body
    path = tmp_path / "blob.bin"
    half = len(body) // 2
    (tmp_path / "blob.bin.part").write_bytes(body[:half])

    download.download(server.url("blob.bin"), str(path), _md5(body))

    assert server.requests == [("/blob.bin", f"bytes={half}-")]
    assert server.bytes_sent == len(body) - half
    assert path.read_bytes() == body
    assert not (tmp_path / "blob.bin.part").exists()
    assert "(100%)" in capsys.readouterr().err


def test_server_ignoring_range_restarts_cleanly(server, tmp_path):
    body = os.urandom(200_000)
    server.files["blob.bin"] = body
    server.honour_range = False
    path = tmp_path / "blob.bin"
    # Wrong bytes in the .part: appending to them would fail the md5.
    (tmp_path / "blob.bin.part").write_bytes(b"x" * 1000)

    download.download(server.url("blob.bin"), str(path), _md5(body))

    assert server.requests == [("/blob.bin", "bytes=1000-")]
    assert path.read_bytes() == body


def test_dropped_connection_is_resumed_by_a_retry(server, tmp_path):
    body = os.urandom(200_000)
    server.files["blob.bin"] = body
    server.drop_next_after = 70_000
    path = tmp_path / "blob.bin"

    download.download(
        server.url("blob.bin"), str(path), _md5(body), retry_wait=0
    )

    assert server.requests == [
        ("/blob.bin", None),
        ("/blob.bin", "bytes=70000-"),
    ]
    assert path.read_bytes() == body


def test_complete_part_file_gets_416_and_is_verified(server, tmp_path):
    body = os.urandom(10_000)
    server.files["blob.bin"] = body
    (tmp_path / "blob.bin.part").write_bytes(body)
    path = tmp_path / "blob.bin"
    download.download(server.url("blob.bin"), str(path), _md5(body))
    assert server.bytes_sent == 0
    assert path.read_bytes() == body


def test_md5_mismatch_names_url_and_both_sums_and_deletes(server, tmp_path):
    body = os.urandom(50_000)
    server.files["blob.bin"] = body
    url = server.url("blob.bin")
    wrong = "0" * 32
    with pytest.raises(DataError) as raised:
        download.download(url, str(tmp_path / "blob.bin"), wrong)
    message = str(raised.value)
    assert url in message and wrong in message and _md5(body) in message
    assert os.listdir(tmp_path) == []


def test_http_404_is_one_clear_error_without_retries(server, tmp_path):
    url = server.url("missing.tar.gz")
    with pytest.raises(DataError, match="HTTP 404"):
        download.download(url, str(tmp_path / "x"), "0" * 32, retry_wait=0)
    assert len(server.requests) == 1


def _tar_info(name, kind, linkname=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


def _hostile_tars(outside):
    """Each: a valid dataset plus one member that must be refused."""
    escape = str(outside / "escaped.txt")
    return {
        "absolute": (tarfile.TarInfo(escape), b"pwned"),
        "dotdot": (tarfile.TarInfo(f"{FOLDER}/../../escaped.txt"), b"pwned"),
        "symlink": (_tar_info(f"{FOLDER}/etc", tarfile.SYMTYPE, "/etc"), None),
        "hardlink": (
            _tar_info(f"{FOLDER}/h", tarfile.LNKTYPE, "../escaped.txt"),
            None,
        ),
        "device": (_tar_info(f"{FOLDER}/null", tarfile.CHRTYPE), None),
        "fifo": (_tar_info(f"{FOLDER}/pipe", tarfile.FIFOTYPE), None),
    }


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("absolute", "absolute member path"),
        ("dotdot", "'..'"),
        ("symlink", r"symbolic link \(-> '/etc'\)"),
        ("hardlink", "hard link"),
        ("device", "device"),
        ("fifo", "FIFO"),
    ],
)
def test_hostile_tar_is_refused_and_nothing_is_written(
    tmp_path, case, expected
):
    out = tmp_path / "out" / "datasets"
    out.mkdir(parents=True)
    archive = tmp_path / "hostile.tar.gz"
    member = _hostile_tars(tmp_path)[case]
    archive.write_bytes(_tar_gz([*_regular_tar_members(), member]))

    with pytest.raises(DataError, match=expected) as raised:
        download.extract(str(archive), str(out), FOLDER, "stamp")

    assert str(archive) in str(raised.value)
    assert os.listdir(out) == []  # No dataset folder, no staging leftovers.
    assert sorted(os.listdir(tmp_path)) == ["hostile.tar.gz", "out"]
    assert os.listdir(tmp_path / "out") == ["datasets"]


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("tiny-imagenet-200/../../escaped.txt", "'..'"),
        ("/tmp/escaped_by_zip.txt", "absolute member path"),
        ("..\\escaped.txt", "'..'"),
        ("symlink", "symbolic link"),
    ],
)
def test_hostile_zip_is_refused(tmp_path, entry, expected):
    if entry == "symlink":
        entry = zipfile.ZipInfo("tiny-imagenet-200/etc")
        entry.external_attr = (stat.S_IFLNK | 0o777) << 16
    out = tmp_path / "out"
    out.mkdir()
    archive = tmp_path / "hostile.zip"
    ok = ("tiny-imagenet-200/wnids.txt", b"n01443537\n")
    archive.write_bytes(_zip([ok, (entry, b"/etc")]))

    with pytest.raises(DataError, match=expected):
        download.extract(str(archive), str(out), "tiny-imagenet-200", "s")

    assert os.listdir(out) == []
    assert sorted(os.listdir(tmp_path)) == ["hostile.zip", "out"]


def test_crash_while_unpacking_leaves_no_complete_looking_folder(
    server, fake_cifar10, tmp_path, monkeypatch
):
    url = server.url("mirror/cifar-10-binary.tar.gz")

    def extract_then_crash(archive, staging):
        (pathlib.Path(staging) / FOLDER).mkdir()
        raise KeyboardInterrupt

    real_extract_tar = download._extract_tar
    monkeypatch.setattr(download, "_extract_tar", extract_then_crash)
    with pytest.raises(KeyboardInterrupt):
        download.prepare("cifar10", str(tmp_path), url=url)
    assert sorted(os.listdir(tmp_path)) == ["cifar-10-binary.tar.gz"]

    # A hard kill skips cleanup; the next run removes the staging leftover
    # and reuses the verified archive without downloading it again.
    (tmp_path / f".{FOLDER}.killed.partial" / FOLDER).mkdir(parents=True)
    monkeypatch.setattr(download, "_extract_tar", real_extract_tar)
    target = download.prepare("cifar10", str(tmp_path), url=url)
    _assert_unpacked(target, FILES)
    assert sorted(os.listdir(tmp_path)) == [FOLDER]
    assert len(server.requests) == 1


def test_existing_folder_not_made_by_the_tool_is_left_alone(
    fake_cifar10, tmp_path
):
    (tmp_path / FOLDER).mkdir()
    (tmp_path / FOLDER / "mine.txt").write_text("user data")
    with pytest.raises(DataError, match="move it away"):
        download.prepare("cifar10", str(tmp_path))
    assert (tmp_path / FOLDER / "mine.txt").read_text() == "user data"


def test_unknown_format_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="tinyimagenet comes as jpeg"):
        download.prepare("tinyimagenet", str(tmp_path), fmt="python")


def _sha256(data):
    return hashlib.sha256(data).hexdigest()


def test_weights_registry_matches_publishers_and_loaders():
    from keras.src.applications import resnet as keras_resnet

    from tf_resnet.models import pretrained

    torch_file = download.WEIGHTS["resnet18"]
    assert torch_file.filename == f"resnet18-{torch_file.digest}.pth"
    assert torch_file.algorithm == "sha256"
    keras_file = download.WEIGHTS["keras_resnet50"]
    assert keras_file.filename == pretrained.KERAS_RESNET50_FILE
    assert keras_file.url == keras_resnet.BASE_WEIGHTS_PATH + (
        pretrained.KERAS_RESNET50_FILE
    )
    # (include_top md5, notop md5), as keras.applications.ResNet50 checks.
    assert keras_file.digest == keras_resnet.WEIGHTS_HASHES["resnet50"][1]


def test_resnet18_weights_resume_and_verify_by_sha256_prefix(
    server, tmp_path, monkeypatch, capsys
):
    body = os.urandom(250_000)
    prefix = _sha256(body)[:8]
    name = f"resnet18-{prefix}.pth"
    server.files[f"mirror/{name}"] = body
    spec = dataclasses.replace(
        download.WEIGHTS["resnet18"],
        url=f"http://127.0.0.1:9/{name}",
        digest=prefix,
    )
    monkeypatch.setitem(download.WEIGHTS, "resnet18", spec)
    out = tmp_path / "weights"
    out.mkdir()
    (out / f"{name}.part").write_bytes(body[:100_000])
    argv = [
        "--weights=resnet18",
        f"--output_dir={out}",
        f"--url={server.url(f'mirror/{name}')}",
    ]

    download.main(argv)

    assert capsys.readouterr().out.strip() == str(out / name)
    assert server.requests == [(f"/mirror/{name}", "bytes=100000-")]
    assert (out / name).read_bytes() == body
    assert os.listdir(out) == [name]
    download.main(argv)  # Already there and verified: no request.
    assert len(server.requests) == 1
    assert "already downloaded and verified" in capsys.readouterr().err


def test_weights_with_the_wrong_sha256_prefix_are_deleted(server, tmp_path):
    body = os.urandom(20_000)
    server.files["resnet18-f37072fd.pth"] = body  # Not torchvision's file.
    with pytest.raises(DataError) as raised:
        download.prepare_weights(
            "resnet18",
            str(tmp_path),
            url=server.url("resnet18-f37072fd.pth"),
            retry_wait=0,
        )
    message = str(raised.value)
    assert f"sha256 of the download is {_sha256(body)}" in message
    assert "expected f37072fd..." in message
    assert os.listdir(tmp_path) == []


def test_keras_weights_go_where_pretrained_imagenet_looks(
    server, tmp_path, monkeypatch
):
    from tf_resnet.models import pretrained

    body = os.urandom(30_000)
    real = download.WEIGHTS["keras_resnet50"]
    server.files[real.filename] = body
    spec = dataclasses.replace(
        real, url=f"http://127.0.0.1:9/{real.filename}", digest=_md5(body)
    )
    monkeypatch.setitem(download.WEIGHTS, "keras_resnet50", spec)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))

    path = download.prepare_weights(
        "keras_resnet50", url=server.url(real.filename)
    )

    assert path == pretrained.keras_weights_path("imagenet")
    assert pathlib.Path(path).read_bytes() == body


def test_foreign_file_under_the_weights_name_is_left_alone(tmp_path):
    name = download.WEIGHTS["resnet18"].filename
    (tmp_path / name).write_bytes(b"my own fine-tuned weights")
    with pytest.raises(DataError, match="move it away"):
        download.prepare_weights("resnet18", str(tmp_path))
    assert (tmp_path / name).read_bytes() == b"my own fine-tuned weights"


def test_the_default_data_root_is_the_checkouts_datasets(monkeypatch, tmp_path):
    """Wherever it runs from: the batch jobs' DATA_ROOT reads it there."""
    asked = {}
    monkeypatch.setattr(
        download, "prepare", lambda name, out, **_: asked.setdefault(name, out)
    )
    monkeypatch.chdir(tmp_path)
    download.main(["--dataset=cifar100"])
    assert asked == {"cifar100": os.path.join(ROOT, "datasets")}
    assert download.default_weights_dir("resnet18") == os.path.join(
        ROOT, "weights"
    )
    with open(os.path.join(ROOT, "scripts", "course_job.sh")) as stream:
        assert "DATA_ROOT=${DATA_ROOT:-$REPO/datasets}" in stream.read()
