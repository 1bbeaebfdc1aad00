"""The container side of a Batch task, without a Docker engine: the image's configuration read
from ``docker/Dockerfile`` and the ``docker create`` options of a task's container settings.

Batch creates a task's container with ``docker create [Batch's options] [containerRunOptions]
IMAGE [command line]`` (``articles/batch/batch-docker-container-workloads.md``, "Container task
command line": "Batch automatically uses the docker create command ... Optional
ContainerRunOptions are additional arguments you provide to the docker create command"). The
command line becomes the container's CMD and the image's ENTRYPOINT stays in front of it
(MicrosoftDocs/azure-docs #94943), exactly as ``docker create IMAGE COMMAND...`` does.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path


class PayloadError(RuntimeError):
    """What Docker or Batch would refuse before the task's process starts; one line."""


@dataclass(frozen=True)
class ImageConfig:
    """The parts of ``docker image inspect`` that decide how a container starts."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    user: str = ""
    workdir: str = ""
    shell: tuple[str, ...] = ("/bin/sh", "-c")

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def with_env(self, key: str, value: str) -> ImageConfig:
        env = dict(self.env)
        env[key] = value
        return replace(self, env=tuple(env.items()))


# Base images whose configuration the emulator cannot pull: what their own Dockerfiles set.
# nvidia/cuda (NVIDIA's container-images/cuda repository, base/Dockerfile): PATH with the CUDA and
# driver folders, and ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh"], a script that prints a
# banner and then runs `exec "$@"`. No CMD is set there beyond the ubuntu base's ["bash"].
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NVIDIA_ENTRYPOINT = "/opt/nvidia/nvidia_entrypoint.sh"
KNOWN_BASES: dict[str, ImageConfig] = {
    "nvidia/cuda": ImageConfig(
        entrypoint=(NVIDIA_ENTRYPOINT,),
        cmd=("bash",),
        env=(
            ("PATH", f"/usr/local/nvidia/bin:/usr/local/cuda/bin:{DEFAULT_PATH}"),
            ("NVIDIA_VISIBLE_DEVICES", "all"),
            ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
        ),
    ),
    "ubuntu": ImageConfig(cmd=("bash",), env=(("PATH", DEFAULT_PATH),)),
    # docker-library's debian images: CMD ["bash"], Docker's default PATH.
    "debian": ImageConfig(cmd=("bash",), env=(("PATH", DEFAULT_PATH),)),
}


def _logical_lines(text: str) -> list[str]:
    """Instructions with line continuations joined and comment lines dropped (the default
    escape character ``\\``; comment lines inside a continuation are skipped, as BuildKit does)."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        current += raw
        if current.strip():
            lines.append(current.strip())
        current = ""
    if current.strip():
        lines.append(current.strip())
    return lines


def _substitute(text: str, values: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, "")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, text)


def _json_or_shell(arguments: str, shell: tuple[str, ...]) -> tuple[str, ...]:
    """ENTRYPOINT/CMD/SHELL arguments: the exec (JSON array) form, else the shell form, which
    runs under the stage's SHELL (Dockerfile reference, "Shell and exec form")."""
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, list) and all(isinstance(item, str) for item in parsed):
        return tuple(parsed)
    return (*shell, arguments)


def _env_pairs(arguments: str, values: dict[str, str]) -> list[tuple[str, str]]:
    words = shlex.split(arguments)
    if words and "=" not in words[0]:  # legacy form: ENV KEY value with spaces
        key, _, rest = arguments.partition(" ")
        return [(key, _substitute(rest.strip(), values))]
    pairs = []
    for word in words:
        key, _, value = word.partition("=")
        pairs.append((key, _substitute(value, values)))
    return pairs


def _image_repository(reference: str) -> str:
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    # Docker Hub's implicit prefixes (its host name, then the "library/" namespace).
    first, _, rest = name.partition("/")
    if "." in first and rest:
        name = rest
    return name.removeprefix("library/")


def read_dockerfile(path: Path, build_args: dict[str, str] | None = None) -> ImageConfig:
    """The final stage's configuration, with what it inherits from its base (a previous stage
    or a known base image) as Docker's builder computes it."""
    global_args: dict[str, str] = {}
    stages: dict[str, ImageConfig] = {}
    config: ImageConfig | None = None
    scope: dict[str, str] = {}
    build_args = build_args or {}
    index = 0
    current = ""
    for line in _logical_lines(path.read_text()):
        instruction, _, arguments = line.partition(" ")
        instruction = instruction.upper()
        arguments = arguments.strip()
        if instruction == "ARG":
            name, _, default = arguments.partition("=")
            value = build_args.get(name, _substitute(default, {**global_args, **scope}))
            (scope if config is not None else global_args)[name] = value
            continue
        if instruction == "FROM":
            words = arguments.split()
            words = [w for w in words if not w.startswith("--platform")]
            reference = _substitute(words[0], global_args)
            current = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(index)
            config = stages[current] = _base(reference, stages)
            scope = {}
            index += 1
            continue
        if config is None:
            continue
        values = {**global_args, **config.env_dict(), **scope}
        config = stages[current] = _instruction(config, instruction, arguments, values)
    if config is None:
        raise PayloadError(f"{path}: no FROM instruction")
    return config


def _base(reference: str, stages: dict[str, ImageConfig]) -> ImageConfig:
    """What ``FROM reference`` starts from: an earlier stage, or a known base image."""
    if reference in stages:
        return stages[reference]
    repository = _image_repository(reference)
    if repository not in KNOWN_BASES:
        raise PayloadError(
            f"FROM {reference}: base image {repository} is not known to the "
            f"emulator; add its ENTRYPOINT/CMD/ENV to KNOWN_BASES"
        )
    return KNOWN_BASES[repository]


def _instruction(
    config: ImageConfig, instruction: str, arguments: str, values: dict[str, str]
) -> ImageConfig:
    """``config`` after one instruction of a stage (those that change how a container starts)."""
    if instruction == "ENV":
        for key, value in _env_pairs(arguments, values):
            config = config.with_env(key, value)
            values[key] = value
    elif instruction == "SHELL":
        config = replace(config, shell=_json_or_shell(arguments, config.shell))
    elif instruction == "ENTRYPOINT":
        # Dockerfile reference: "If CMD is defined from the base image, setting ENTRYPOINT
        # will reset CMD to an empty value."
        config = replace(config, entrypoint=_json_or_shell(arguments, config.shell), cmd=())
    elif instruction == "CMD":
        config = replace(config, cmd=_json_or_shell(arguments, config.shell))
    elif instruction == "USER":
        config = replace(config, user=_substitute(arguments, values))
    elif instruction == "WORKDIR":
        config = replace(config, workdir=_substitute(arguments, values))
    return config


def container_argv(image: ImageConfig, command_line: str, entrypoint: str | None) -> list[str]:
    """``docker create [--entrypoint E] IMAGE COMMAND...``: the process the container starts.

    Batch gives the task command line to ``docker create`` as the command (CMD) and keeps the
    image's ENTRYPOINT (MicrosoftDocs/azure-docs #94943); an empty command line keeps the
    image's CMD too (batch-docker-container-workloads.md: "To use the default ENTRYPOINT of the
    container image, set the task command line to the empty string"). ``--entrypoint`` in the
    run options replaces the ENTRYPOINT and, as in Docker, drops the image's CMD."""
    command = shlex.split(command_line)
    if entrypoint is not None:
        head = shlex.split(entrypoint)
        return [*head, *command]
    return [*image.entrypoint, *(command or image.cmd)]


# --- docker create options -------------------------------------------------------------------
# From the `docker container create` reference (docs.docker.com/reference/cli/docker/container/
# create/): every option with whether it takes a value. An option not listed is what the
# Docker CLI answers with "unknown flag", and the container is never created.
_VALUE_OPTIONS = {
    "--add-host", "--annotation", "--attach", "--blkio-weight", "--blkio-weight-device",
    "--cap-add", "--cap-drop", "--cgroup-parent", "--cgroupns", "--cidfile", "--cpu-period",
    "--cpu-quota", "--cpu-rt-period", "--cpu-rt-runtime", "--cpu-shares", "--cpus",
    "--cpuset-cpus", "--cpuset-mems", "--device", "--device-cgroup-rule", "--device-read-bps",
    "--device-read-iops", "--device-write-bps", "--device-write-iops", "--dns", "--dns-option",
    "--dns-search", "--domainname", "--entrypoint", "--env", "--env-file", "--expose", "--gpus",
    "--group-add", "--health-cmd", "--health-interval", "--health-retries",
    "--health-start-interval", "--health-start-period", "--health-timeout", "--hostname", "--ip",
    "--ip6", "--ipc", "--isolation", "--label", "--label-file", "--link", "--link-local-ip",
    "--log-driver", "--log-opt", "--mac-address", "--memory", "--memory-reservation",
    "--memory-swap", "--memory-swappiness", "--mount", "--name", "--network", "--net",
    "--network-alias", "--oom-score-adj", "--pid", "--pids-limit", "--platform", "--publish",
    "--pull", "--restart", "--runtime", "--security-opt", "--shm-size", "--stop-signal",
    "--stop-timeout", "--storage-opt", "--sysctl", "--tmpfs", "--ulimit", "--user", "--userns",
    "--uts", "--volume", "--volume-driver", "--volumes-from", "--workdir",
}  # fmt: skip
_FLAG_OPTIONS = {
    "--disable-content-trust", "--init", "--interactive", "--no-healthcheck",
    "--oom-kill-disable", "--privileged", "--publish-all", "--quiet", "--read-only", "--rm",
    "--tty", "--use-api-socket",
}  # fmt: skip
_SHORT = {
    "-a": "--attach", "-c": "--cpu-shares", "-e": "--env", "-h": "--hostname",
    "-i": "--interactive", "-l": "--label", "-m": "--memory", "-p": "--publish",
    "-P": "--publish-all", "-q": "--quiet", "-t": "--tty", "-u": "--user", "-v": "--volume",
    "-w": "--workdir",
}  # fmt: skip
# `docker run --ulimit` takes the names of setrlimit(2) resources (Docker's units package).
_ULIMITS = {
    "as": "RLIMIT_AS", "core": "RLIMIT_CORE", "cpu": "RLIMIT_CPU", "data": "RLIMIT_DATA",
    "fsize": "RLIMIT_FSIZE", "locks": "RLIMIT_LOCKS", "memlock": "RLIMIT_MEMLOCK",
    "msgqueue": "RLIMIT_MSGQUEUE", "nice": "RLIMIT_NICE", "nofile": "RLIMIT_NOFILE",
    "nproc": "RLIMIT_NPROC", "rss": "RLIMIT_RSS", "rtprio": "RLIMIT_RTPRIO",
    "rttime": "RLIMIT_RTTIME", "sigpending": "RLIMIT_SIGPENDING", "stack": "RLIMIT_STACK",
}  # fmt: skip
# capabilities(7), as `--cap-add` accepts them (with or without the CAP_ prefix).
_CAPABILITIES = {
    "AUDIT_CONTROL", "AUDIT_READ", "AUDIT_WRITE", "BLOCK_SUSPEND", "BPF", "CHECKPOINT_RESTORE",
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "IPC_LOCK", "IPC_OWNER",
    "KILL", "LEASE", "LINUX_IMMUTABLE", "MAC_ADMIN", "MAC_OVERRIDE", "MKNOD", "NET_ADMIN",
    "NET_BIND_SERVICE", "NET_BROADCAST", "NET_RAW", "PERFMON", "SETFCAP", "SETGID", "SETPCAP",
    "SETUID", "SYSLOG", "SYS_ADMIN", "SYS_BOOT", "SYS_CHROOT", "SYS_MODULE", "SYS_NICE",
    "SYS_PACCT", "SYS_PTRACE", "SYS_RAWIO", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG",
    "WAKE_ALARM", "ALL",
}  # fmt: skip
_SIZE = re.compile(r"^\d+(\.\d+)?[bkmgBKMG]?$")


@dataclass
class RunOptions:
    """The parsed ``containerRunOptions`` the emulator acts on; the rest is validated only."""

    network: str = "default"
    ipc: str = "private"
    pid: str = "private"
    ulimits: dict[str, tuple[int, int]] = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)
    volumes: list[tuple[str, str, bool]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    entrypoint: str | None = None
    user: str | None = None
    raw: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)  # every --network, in order
    gpus: list[str] = field(default_factory=list)  # every --gpus (Batch's own only)


def _limit(text: str, option: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise PayloadError(f"{option}: {text!r} is not a number") from None
    if value < -1:
        raise PayloadError(f"{option}: {value} is below -1 (unlimited)")
    return value


def parse_run_options(text: str | None, owner: str = "containerRunOptions") -> RunOptions:
    """Validate ``containerRunOptions`` as the Docker CLI parses ``docker create`` options
    (``owner`` names whose arguments they are in a message)."""
    options = RunOptions(raw=shlex.split(text or ""))
    words = list(options.raw)
    while words:
        word = words.pop(0)
        if not word.startswith("-"):
            raise PayloadError(
                f"{owner}: {word!r} is not an option; Batch appends the image and "
                f"command line itself"
            )
        name, has_inline, inline = word.partition("=")
        name = _SHORT.get(name, name)
        if name in _FLAG_OPTIONS:
            continue
        if name not in _VALUE_OPTIONS:
            raise PayloadError(f"{owner}: unknown flag: {name} (docker create)")
        if has_inline:
            value = inline
        elif words:
            value = words.pop(0)
        else:
            raise PayloadError(f"{owner}: flag needs an argument: {name}")
        if name == "--gpus" and owner != "containerRunOptions":
            options.gpus.append(value)
            continue
        _apply(options, name, value)
    return options


def _apply(options: RunOptions, name: str, value: str) -> None:
    if name == "--gpus":
        # Batch refuses it before Docker sees it: ContainerInvalidSettings "Some supplied docker
        # options are not recognized or are unsupported: --gpus" (epi2me-labs/wf-basecalling #6).
        # batch-docker-container-workloads.md: "For container pools with GPU-enabled hardware,
        # Batch will automatically enable GPU for container tasks, so you shouldn't include the
        # --gpus argument."
        raise PayloadError(
            "containerRunOptions: --gpus: Batch enables GPUs for container tasks itself; "
            "the argument must not be given (batch-docker-container-workloads.md)"
        )
    if name in ("--network", "--net", "--ipc", "--pid"):
        _apply_namespace(options, name, value)
    elif name == "--shm-size":
        if not _SIZE.match(value):
            raise PayloadError(f"--shm-size {value}: not a size (e.g. 64g)")
    elif name == "--ulimit":
        resource, _, limits = value.partition("=")
        if resource not in _ULIMITS or not limits:
            raise PayloadError(f"--ulimit {value}: expected <{'|'.join(_ULIMITS)}>=soft[:hard]")
        soft, _, hard = limits.partition(":")
        soft_value = _limit(soft, f"--ulimit {value}")
        hard_value = _limit(hard, f"--ulimit {value}") if hard else soft_value
        options.ulimits[_ULIMITS[resource]] = (soft_value, hard_value)
    elif name == "--device":
        host = value.split(":", 1)[0]
        if not host.startswith("/"):
            raise PayloadError(f"--device {value}: the host path must be absolute")
        options.devices.append(host)
    elif name == "--cap-add" or name == "--cap-drop":
        if value.upper().removeprefix("CAP_") not in _CAPABILITIES:
            raise PayloadError(f"{name} {value}: unknown capability")
    elif name == "--volume":
        parts = value.split(":")
        if len(parts) not in (2, 3) or not parts[1].startswith("/"):
            raise PayloadError(f"-v {value}: expected /host:/container[:ro|rw]")
        if len(parts) == 3 and not set(parts[2].split(",")) <= {"ro", "rw", "z", "Z", "rslave"}:
            raise PayloadError(f"-v {value}: unknown mode {parts[2]}")
        read_only = len(parts) == 3 and "ro" in parts[2].split(",")
        options.volumes.append((parts[0], parts[1], read_only))
    elif name == "--env":
        key, has_value, env_value = value.partition("=")
        if has_value:
            options.env[key] = env_value
    elif name == "--workdir":
        options.workdir = value
    elif name == "--entrypoint":
        options.entrypoint = value
    elif name == "--user":
        options.user = value


def _apply_namespace(options: RunOptions, name: str, value: str) -> None:
    """``--network``, ``--ipc`` or ``--pid``: which namespace the container shares."""
    if name in ("--network", "--net"):
        if value not in ("host", "bridge", "none", "default") and not re.match(
            r"^[\w.:-]+$", value
        ):
            raise PayloadError(f"--network {value}: not a network mode")
        options.network = value
        options.networks.append(value)
    elif name == "--ipc":
        if value not in ("host", "private", "shareable", "none") and not value.startswith(
            "container:"
        ):
            raise PayloadError(f"--ipc {value}: invalid IPC mode")
        options.ipc = value
    elif name == "--pid":
        if value != "host" and not value.startswith("container:"):
            raise PayloadError(f"--pid {value}: invalid PID mode")
        options.pid = value


# --- the whole `docker create` of a container task ------------------------------------------
# What Batch adds to `docker create` itself, from batch-docker-container-workloads.md ("Container
# task working directory"): the Batch folders mapped into the container at the same paths (all of
# AZ_BATCH_NODE_ROOT_DIR, or the containerHostBatchBindMounts entries), every task environment
# variable, the task working directory AZ_BATCH_TASK_WORKING_DIR (unless the task's
# workingDirectory is containerImageDefault), the task user's uid:gid ("Batch will map the
# user/group permission to the container") and, on a GPU pool, the GPUs ("Batch will
# automatically enable GPU for container tasks"). No --network: the same article warns that
# Docker's default bridge (172.17.0.0/16) may clash with the pool's virtual network, so
# containers get the default network unless the run options say otherwise.
# The exact arguments are undocumented (the agent drives Docker's API from Python: the
# "UnixHTTPConnectionPool" error of Azure/Batch #4), so the emulator takes the unfavourable
# reading of each: GPUs as `--gpus all`, which collides with a user's --gpus, and binds as
# `-v src:src`, which collide with a user's volume at the same destination.
def batch_create_args(
    *,
    gpu_pool: bool,
    user: tuple[int, int],
    workdir: str | None,
    env: dict[str, str],
    binds: list[tuple[str, bool]],
) -> list[str]:
    """Batch's own ``docker create`` arguments for a task, before the run options."""
    args = ["--gpus", "all"] if gpu_pool else []
    args += ["-u", f"{user[0]}:{user[1]}"]
    if workdir is not None:
        args += ["-w", workdir]
    for key, value in env.items():
        args += ["-e", f"{key}={value}"]
    for source, read_only in binds:
        args += ["-v", f"{source}:{source}" + (":ro" if read_only else "")]
    return args


def docker_create_options(batch_args: list[str], run_options: str | None) -> RunOptions:
    """The run options as Batch validates them, then the whole argument list
    (``docker create [Batch's arguments] [run options] IMAGE ...``) as Docker parses it;
    returns the run options' part, which the emulator acts on."""
    options = parse_run_options(run_options)
    whole = parse_run_options(shlex.join(batch_args), owner="Batch's own arguments")
    _check_together(whole, options)
    return options


def _check_together(batch: RunOptions, ours: RunOptions) -> None:
    """What Docker (or, where unknown, the agent: the unfavourable reading) refuses when the
    run options meet Batch's own arguments or repeat themselves."""
    networks = batch.networks + ours.networks
    for network in set(networks):
        if networks.count(network) > 1:
            # docker/cli parseNetworkOpts: "network %q is specified multiple times".
            raise PayloadError(f"--network {network}: network is specified multiple times")
    builtin = {"host", "bridge", "none", "default"}
    if len(set(networks)) > 1 and any(n in builtin or n.startswith("container:") for n in networks):
        # docker/cli parseNetworkOpts: a built-in network mode cannot be combined with another.
        raise PayloadError(
            f"--network {' --network '.join(networks)}: conflicting options: cannot attach both "
            "user-defined and non-user-defined network-modes"
        )
    devices = batch.devices + ours.devices
    for device in set(devices):
        if devices.count(device) > 1:
            # runc tolerates a device node twice; the agent's own option handling is not
            # documented: the unfavourable reading, refused.
            raise PayloadError(f"--device {device}: given twice (by Batch or the run options)")
    gpus = batch.gpus + ours.gpus
    if len(gpus) > 1:
        raise PayloadError(f"--gpus {' --gpus '.join(gpus)}: GPUs requested twice")
    destinations = [container for _, container, _ in batch.volumes + ours.volumes]
    for destination in set(destinations):
        if destinations.count(destination) > 1:
            # moby daemon (volumes): "Duplicate mount point: %s", the container is not created.
            raise PayloadError(f"-v ...:{destination}: Duplicate mount point: {destination}")
