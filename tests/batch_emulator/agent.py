"""The emulated Batch node agent: the processes the emulator starts inside a node's namespaces.

``run SPEC``   PID 1 of a task's process tree (a container, or a task on the node itself):
               applies the node's and the container's mounts, the run options' ulimits, drops
               to the task user, starts the command, reports its exit code on a pipe and, if
               the container lifecycle says so, stays up (reaping) after the command returned.
``imds FILE``  the node's instance metadata service on 169.254.169.254:80: managed-identity
               tokens for the pool's user-assigned identities, the VM's name and the pool's
               Scheduled Events (the emulator's file; approvals appended to another).
``hold PORT``  Batch's own listener on the port in AZ_BATCH_MASTER_NODE (master node only).
``upload SPEC`` a task's output files to Blob storage with the node's managed identity.
``blob-serve`` the tests' own storage operations with the account key, one JSON line each.

Standard library only (except ``upload`` and ``blob-serve``): it starts in a few milliseconds."""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import resource
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
CLONE_NEWUSER = 0x10000000
# Host uids 0..99999 keep their numbers in a squashed root's user namespace; the emulated NFS
# server's root (100000, see tests.batch_emulator.declared.SERVER_ROOT) is left out, so root on the
# node has no capability over the server's root-owned files: it gets their "other" permissions,
# which is what root_squash (exports(5)) gives it.
SQUASH_MAP = "0 0 100000\n"

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None):
    result = _libc.mount(
        source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
        data.encode() if data else None,
    )  # fmt: skip
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} -> {target}: {os.strerror(errno)}")


def _umount(target: str) -> None:
    if _libc.umount2(target.encode(), MNT_DETACH) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"umount {target}: {os.strerror(errno)}")


def _bind(source: str, target: str, read_only: bool) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        _mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def apply_mounts(operations: list[dict]) -> str | None:
    """Mount operations in order, in this process's private mount namespace; the root the
    task's process is to run in, when an ``image_root`` operation made one (a container of the
    built image: the later operations' paths are inside it)."""
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    root = None
    for op in operations:
        kind = op["op"]
        if root is not None and "dst" in op:
            op = {**op, "dst": root + op["dst"]}
        if kind == "image_root":
            root = _image_root(op)
        elif kind == "bind":
            if os.path.isdir(op["src"]):
                os.makedirs(op["dst"], exist_ok=True)
            _bind(op["src"], op["dst"], op.get("ro", False))
        elif kind == "tmpfs":
            os.makedirs(op["dst"], exist_ok=True)
            _mount("tmpfs", op["dst"], "tmpfs", 0, "mode=0755")
        elif kind == "mkdir":
            os.makedirs(op["dst"], mode=op.get("mode", 0o755), exist_ok=True)
        elif kind == "file":
            with open(op["dst"], "w") as handle:
                handle.write(op["content"])
            os.chmod(op["dst"], op.get("mode", 0o644))
        elif kind == "umount":
            _umount(op["dst"])
        elif kind == "sys_class":
            _fake_sys_class(op["stage"], op["entries"], root or "")
        else:
            raise ValueError(f"unknown mount operation {kind}")
    return root


def _image_root(op: dict) -> str:
    """A container's own root file system, as Docker's overlay2 driver makes it: the image's
    files as the lower layer, the container's writes in an upper layer of its own; the
    kernel's /proc (this PID namespace's), /dev and /sys inside it."""
    root, upper, work = op["root"], op["upper"], op["work"]
    for folder in (root, upper, work):
        os.makedirs(folder, exist_ok=True)
    _mount("overlay", root, "overlay", 0, f"lowerdir={op['image']},upperdir={upper},workdir={work}")
    for kernel in ("/proc", "/dev", "/sys"):
        os.makedirs(root + kernel, exist_ok=True)
        _mount(kernel, root + kernel, None, MS_BIND | MS_REC)
    for made in ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf"):  # Docker writes these
        if not os.path.exists(root + made):
            open(root + made, "a").close()
    return root


def _fake_sys_class(stage: str, entries: dict[str, str], root: str = "") -> None:
    """/sys/class (under ``root``) as the node's hardware would show it: the real classes
    (this namespace's net devices) plus the given entries (e.g. ``infiniband``) from the
    emulated node."""
    keep = os.path.join(stage, "class")
    sys_class = root + "/sys/class"
    os.makedirs(keep, exist_ok=True)
    _bind(sys_class, keep, False)
    _mount("tmpfs", sys_class, "tmpfs", 0, "mode=0755")
    for name in os.listdir(keep):
        if name in entries:
            continue
        os.mkdir(os.path.join(sys_class, name))
        _bind(os.path.join(keep, name), os.path.join(sys_class, name), False)
    for name, source in entries.items():
        os.mkdir(os.path.join(sys_class, name))
        _bind(source, os.path.join(sys_class, name), True)
    _umount(keep)


def _child(spec: dict) -> None:
    """In the forked child: the task's identity, limits, folders and program (never returns)."""
    try:
        for name, (soft, hard) in spec.get("rlimits", {}).items():
            limit = getattr(resource, name)
            wanted = [resource.RLIM_INFINITY if v == -1 else v for v in (soft, hard)]
            try:
                resource.setrlimit(limit, tuple(wanted))
            except ValueError:
                # Raising a hard limit needs CAP_SYS_RESOURCE, which Docker's daemon has and
                # a test machine's root may lack: the most this machine allows, and say so.
                ceiling = resource.getrlimit(limit)[1]
                capped = [
                    ceiling
                    if ceiling != resource.RLIM_INFINITY
                    and (v == resource.RLIM_INFINITY or v > ceiling)
                    else v
                    for v in wanted
                ]
                resource.setrlimit(limit, tuple(capped))
                print(
                    f"agent: {name} {wanted} capped at {ceiling} (no CAP_SYS_RESOURCE)",
                    file=sys.stderr,
                    flush=True,
                )
        os.dup2(spec["stdout_fd"], 1)
        os.dup2(spec["stderr_fd"], 2)
        os.close(spec["stdout_fd"])
        os.close(spec["stderr_fd"])
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        if spec.get("root"):
            os.chroot(spec["root"])  # a container of the built image: its own root
        uid, gid = spec["uid"], spec["gid"]
        if uid != 0:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        os.chdir(spec["cwd"])
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except OSError as error:
        # What `docker start` reports when the container's process cannot start.
        os.write(2, f"agent: cannot start {spec['argv'][:1]}: {error}\n".encode())
        os._exit(127)


def run(spec_path: str) -> int:
    with open(spec_path) as handle:
        spec = json.load(handle)
    status = spec.get("status_fd")
    if status is not None:
        os.set_inheritable(status, False)
    # The agent writes the task's stdout.txt/stderr.txt from outside the container (they are
    # in the task folder whether or not the container mounts it).
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    spec["stdout_fd"] = os.open(spec["stdout"], flags, 0o644)
    spec["stderr_fd"] = os.open(spec["stderr"], flags, 0o644)
    try:
        spec["root"] = apply_mounts(spec.get("mounts", []))
    except OSError as error:
        print(f"agent: {error}", file=sys.stderr, flush=True)
        if status is not None:
            os.write(status, json.dumps({"exit": 125, "error": str(error)}).encode() + b"\n")
        return 125
    if spec.get("hostname"):
        socket.sethostname(spec["hostname"])
    # PID 1 ignores signals it has no handler for; the emulator stops containers with SIGKILL.
    signal.signal(signal.SIGTERM, lambda *_: None)
    squash = spec.get("squash_root") and spec["uid"] == 0
    if squash:
        child_reads, parent_writes = os.pipe()
        parent_reads, child_writes = os.pipe()
    pid = os.fork()
    if pid == 0:
        if squash:
            if _libc.unshare(CLONE_NEWUSER) != 0:
                os._exit(125)
            os.write(child_writes, b"u")
            os.read(child_reads, 1)
        _child(spec)
    if squash:
        os.read(parent_reads, 1)
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{name}", "w") as handle:
                handle.write(SQUASH_MAP)
        os.write(parent_writes, b"g")
    code = None
    while code is None:
        reaped, wait_status = os.wait()
        if reaped == pid:
            code = os.waitstatus_to_exitcode(wait_status)
            code = 128 - code if code < 0 else code  # Docker: 128 + signal number
    if status is not None:
        os.write(status, json.dumps({"exit": code}).encode() + b"\n")
    if spec.get("keep_alive"):
        # The lenient container lifecycle: what the command left running keeps running until
        # the emulator ends the task. PID 1 reaps orphans meanwhile.
        while True:
            try:
                os.wait()
            except ChildProcessError:
                time.sleep(0.2)
    return code


# --- IMDS ----------------------------------------------------------------------------------------
def _b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def _token(resource_url: str, client_id: str, tenant: str) -> str:
    """A JWT shaped as Entra ID issues it for a managed identity (the emulated storage checks
    issuer, audience and lifetime, not the signature)."""
    now = int(time.time())
    header = {"alg": "RS256", "typ": "JWT"}
    claims = {
        "aud": resource_url,
        "iss": f"https://sts.windows.net/{tenant}/",
        "iat": now - 60,
        "nbf": now - 60,
        "exp": now + 3600,
        "appid": client_id,
        "oid": client_id,
        "sub": client_id,
        "tid": tenant,
    }
    return f"{_b64(header)}.{_b64(claims)}.{_b64({'sig': 'emulated'})}"


class ScheduledEvents:
    """The VM's view of its placement group's Scheduled Events
    (articles/virtual-machines/linux/scheduled-events.md): the events the emulator lists in
    ``events`` (the whole pool's: events reach every VM of a placement group); approvals
    (``StartRequests``) appended to ``approvals`` for the emulator, which then starts them. The
    first request turns the service on and is answered late ("You should expect a delayed
    response in your first call of up to two minutes"): ``first_call_delay`` seconds after
    it; until then every request waits."""

    def __init__(self, config: dict) -> None:
        self.events_path, self.approvals_path = config["events"], config["approvals"]
        self.vm_name = config["vm_name"]
        self.delay = float(config.get("first_call_delay", 0))
        self.on_at: float | None = None
        self.lock = threading.Lock()

    def wait_until_on(self) -> None:
        with self.lock:
            if self.on_at is None:
                self.on_at = time.monotonic() + self.delay
            on_at = self.on_at
        time.sleep(max(0.0, on_at - time.monotonic()))

    def document(self) -> dict:
        try:
            with open(self.events_path) as handle:
                events = json.load(handle)
        except FileNotFoundError:
            events = []
        return {"DocumentIncarnation": len(events), "Events": events}

    def approve(self, body: dict) -> None:
        with self.lock, open(self.approvals_path, "a") as handle:
            handle.write(json.dumps({"vm": self.vm_name, **body}) + "\n")


def imds(config_path: str) -> int:
    with open(config_path) as handle:
        config = json.load(handle)
    log = open(config["log"], "a", buffering=1)  # noqa: SIM115
    handler = _imds_handler(config, ScheduledEvents(config), log)
    server = ThreadingHTTPServer((config["host"], config["port"]), handler)
    print("ready", flush=True)
    server.serve_forever()
    return 0


def _imds_handler(config: dict, events: ScheduledEvents, log: Any) -> type[BaseHTTPRequestHandler]:
    """The metadata service's answers: tokens, the VM's name, Scheduled Events."""
    identities: dict[str, str] = config["identities"]  # client id -> resource id

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: object) -> None:
            log.write(fmt % args + "\n")

        def _reply(self, code: int, body: dict | str) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            try:
                self.send_response(code)
                kind = "text/plain" if isinstance(body, str) else "application/json"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped waiting for a late answer

        def _scheduled_events(self, method: str) -> None:
            events.wait_until_on()
            if method == "GET":
                self._reply(200, events.document())
                return
            length = int(self.headers.get("Content-Length", 0))
            events.approve(json.loads(self.rfile.read(length)))
            self._reply(200, "")

        def do_POST(self) -> None:
            url = urlparse(self.path)
            if self.headers.get("Metadata") != "true":
                self._reply(400, {"error": "Bad request. Required metadata header not specified"})
            elif url.path == "/metadata/scheduledevents" and "api-version" in url.query:
                self._scheduled_events("POST")
            else:
                self._reply(404, {"error": "not_found"})

        def do_GET(self) -> None:
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            if self.headers.get("Metadata") != "true":
                self._reply(400, {"error": "invalid_request", "error_description": "Metadata"})
                return
            if url.path == "/metadata/scheduledevents" and "api-version" in query:
                self._scheduled_events("GET")
                return
            if url.path == "/metadata/instance/compute/name":
                self._reply(200, events.vm_name)
                return
            if url.path != "/metadata/identity/oauth2/token":
                self._reply(404, {"error": "not_found"})
                return
            self._reply(*_token_answer(query, identities, config["tenant"], log))

    return Handler


def _token_answer(
    query: dict[str, str], identities: dict[str, str], tenant: str, log: Any
) -> tuple[int, dict]:
    """A managed-identity token request's answer: the identity it names (or the only one)."""
    client_id = query.get("client_id")
    mi_res_id = query.get("mi_res_id") or query.get("msi_res_id")
    if client_id is None and mi_res_id is not None:
        client_id = next((c for c, r in identities.items() if r == mi_res_id), "?")
    if client_id is None and len(identities) == 1:
        client_id = next(iter(identities))
    if client_id not in identities:
        log.write(f"identity not found: client_id={client_id}\n")
        return 400, {"error": "invalid_request", "error_description": "Identity not found"}
    resource_url = query.get("resource", "")
    expires = int(time.time()) + 3600
    return (
        200,
        {
            "access_token": _token(resource_url, client_id, tenant),
            "client_id": client_id,
            "expires_in": "3600",
            "expires_on": str(expires),
            "ext_expires_in": "3600",
            "not_before": str(expires - 3660),
            "resource": resource_url,
            "token_type": "Bearer",
        },
    )


def hold(host: str, port: str) -> int:
    """Listen where Batch listens, so a process that binds the same port fails as it would."""
    listener = socket.socket()
    listener.bind((host, int(port)))
    listener.listen()
    print("ready", flush=True)
    while True:
        connection, _ = listener.accept()
        connection.close()


# --- output files --------------------------------------------------------------------------------
def upload(spec_path: str) -> int:
    from azure.identity import ManagedIdentityCredential
    from azure.storage.blob import ContainerClient

    with open(spec_path) as handle:
        spec = json.load(handle)
    for item in spec["uploads"]:
        credential = ManagedIdentityCredential(client_id=item["client_id"])
        container = ContainerClient.from_container_url(item["container_url"], credential=credential)
        with open(item["file"], "rb") as data:
            container.upload_blob(item["blob"], data, overwrite=True)
        print(f"uploaded {item['file']} -> {item['container_url']}/{item['blob']}", flush=True)
    return 0


def _blob_action(request: dict) -> object:
    """One storage operation with the account key, from the storage side of the VNet."""
    from azure.storage.blob import BlobServiceClient

    # "retry_total": 0 for a caller that polls itself: the SDK's own retry waits 15 s before its
    # first one (ExponentialRetry's initial_backoff in azure.storage.blob._shared.policies).
    options = {"retry_total": request["retry_total"]} if "retry_total" in request else {}
    service = BlobServiceClient.from_connection_string(request["connection_string"], **options)
    action = request["action"]
    result: object = None
    if action == "create-containers":
        for name in request["containers"]:
            if not service.get_container_client(name).exists():
                service.create_container(name)
    elif action == "upload-dir":
        container = service.get_container_client(request["container"])
        root = request["folder"]
        for folder, _, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, root)
                with open(path, "rb") as data:
                    container.upload_blob(f"{request['prefix']}/{relative}", data, overwrite=True)
    elif action == "trainer-upload":
        # The project's own upload (checksums as blob metadata, the manifest last).
        from trainer.data.transfer import upload as upload_shards

        container = service.get_container_client(request["container"])
        from pathlib import Path

        upload_shards(Path(request["folder"]), container, request["prefix"], log=lambda _: None)
    elif action == "upload-file":
        container = service.get_container_client(request["container"])
        started = time.monotonic()
        with open(request["file"], "rb") as data:
            container.upload_blob(request["blob"], data, overwrite=True)
        result = {"seconds": time.monotonic() - started}
    elif action == "empty-container":
        container = service.get_container_client(request["container"])
        for name in [b.name for b in container.list_blobs()]:
            container.delete_blob(name)
    elif action == "list":
        container = service.get_container_client(request["container"])
        result = sorted(b.name for b in container.list_blobs(name_starts_with=request["prefix"]))
    elif action == "download":
        container = service.get_container_client(request["container"])
        result = container.download_blob(request["blob"]).readall().decode("utf-8", "replace")
    else:
        raise ValueError(action)
    return result


def blob_serve() -> int:
    """Storage operations, one JSON request per line on stdin, each answered by one line,
    ``{"result": ...}`` or ``{"error": ...}``: one process for a session's many operations
    (starting Python and the Blob SDK for each costs about a second)."""
    for line in sys.stdin:
        try:
            with contextlib.redirect_stdout(sys.stderr):  # stdout carries the answers only
                answer = {"result": _blob_action(json.loads(line))}
        except Exception as err:  # answered to the caller, which raises it
            answer = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    handlers = {"run": run, "imds": imds, "hold": hold, "upload": upload, "blob-serve": blob_serve}
    sys.exit(handlers[command](*arguments))
