"""``dt-data prepare|prepare-text|upload|stage``: build, ship and stage sharded
datasets.

Bad input and failed transfers end with one line naming the file, blob or setting and exit
code 2; an output folder that cannot be written (read-only, immutable, full, a file in the way)
with one line naming the path and the fix and exit code 1. prepare checks every image before it
writes a shard, prepare-text every text file before it replaces one.
"""

from __future__ import annotations

import sys
from pathlib import Path

from trainer.common.cli import OneLineParser, fail, int_in, number_in
from trainer.common.files import OutputError
from trainer.common.grant_wait import CONTRIBUTOR, GRANT_WAIT_MINUTES, READER, GrantWait
from trainer.data.errors import DataError
from trainer.data.manifest import MAX_SHARD_MB
from trainer.data.prepare import DEFAULT_MAX_SHORT_SIDE, DEFAULT_SHARD_MB, prepare
from trainer.data.text_prepare import DEFAULT_SHARD_MB as DEFAULT_TEXT_SHARD_MB
from trainer.data.text_prepare import DEFAULT_VAL_FRACTION, prepare_text
from trainer.data.transfer import container_client, stage, upload

# The flags' ranges: a shard up to 64 GiB, JPEG's largest side, processes and transfers at a time.
SHARD_MB = number_in(0.0, MAX_SHARD_MB, low_open=True)
MAX_SIDE = 65535
PROCESSES = int_in(1, 1024)
PARALLEL = int_in(1, 1024)


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="dt-data", allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="image folder -> tar shards + manifest.json")
    prep.add_argument("src", type=Path, help="dataset root with train/<class>/ and val/")
    prep.add_argument("out", type=Path, help="output folder (empty, or an earlier prepare's)")
    prep.add_argument("--shard-mb", type=SHARD_MB, default=DEFAULT_SHARD_MB, help="shard size")
    prep.add_argument(
        "--max-short-side",
        type=int_in(0, MAX_SIDE),
        default=DEFAULT_MAX_SHORT_SIDE,
        help="store larger images scaled down to this short side in px (0: as they are); the "
        f"default, {DEFAULT_MAX_SHORT_SIDE}, keeps every 224 px training crop a downscale",
    )
    prep.add_argument("--processes", type=PROCESSES, default=None, help="default: all cores")
    prep.add_argument("--strict", action="store_true", help="stop at the first unreadable image")
    text = commands.add_parser("prepare-text", help="text files -> token shards + manifest.json")
    text.add_argument("src", type=Path, help="a UTF-8 text file, or a folder of .txt files")
    text.add_argument("out", type=Path, help="output folder (empty, or an earlier prepare-text's)")
    text.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="a tokenizer.json (tokenizers library) with an end-of-text token; default: UTF-8 "
        "bytes plus end-of-text (257 ids)",
    )
    text.add_argument("--shard-mb", type=SHARD_MB, default=DEFAULT_TEXT_SHARD_MB, help="shard MB")
    text.add_argument(
        "--val-fraction",
        type=number_in(0.0, 1.0, high_open=True),
        default=DEFAULT_VAL_FRACTION,
        help="share of the tokens (the end of the stream) kept for validation",
    )
    for name, helptext in (("upload", "shards -> Blob"), ("stage", "Blob -> local/NFS folder")):
        sub = commands.add_parser(name, help=helptext)
        if name == "upload":
            sub.add_argument("folder", type=Path, help="prepared folder with manifest.json")
        else:
            sub.add_argument("--dest", type=Path, required=True, help="folder to stage into")
        sub.add_argument("--account-url", required=True, help="https://<account>.blob.core...")
        sub.add_argument("--container", default="datasets", help="blob container")
        sub.add_argument("--prefix", required=True, help="dataset folder in the container")
        sub.add_argument("--parallel", type=PARALLEL, default=8, help="shards at a time")
        sub.add_argument(
            "--grant-wait-minutes",
            type=number_in(0.0, 24 * 60.0),
            default=GRANT_WAIT_MINUTES,
            help="while Storage refuses the identity for want of its role (a new role "
            "assignment takes up to 30 min to propagate), retry for this long (0: fail at once)",
        )
    for sub in commands.choices.values():
        sub.error = parser.error  # type: ignore[method-assign]  # one line for subcommands too
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "prepare":
            prepare(
                args.src,
                args.out,
                shard_mb=args.shard_mb,
                max_short_side=args.max_short_side,
                processes=args.processes,
                strict=args.strict,
            )
        elif args.command == "prepare-text":
            prepare_text(
                args.src,
                args.out,
                tokenizer=args.tokenizer,
                shard_mb=args.shard_mb,
                val_fraction=args.val_fraction,
            )
        elif args.command == "upload":
            container = container_client(args.account_url, args.container)
            wait = GrantWait(CONTRIBUTOR, args.grant_wait_minutes, log=_say)
            upload(args.folder, container, args.prefix, parallel=args.parallel, grant_wait=wait)
        else:
            container = container_client(args.account_url, args.container)
            wait = GrantWait(READER, args.grant_wait_minutes, log=_say)
            stage(container, args.prefix, args.dest, parallel=args.parallel, grant_wait=wait)
    except DataError as err:
        fail(str(err), 2)
    except OutputError as err:
        fail(str(err), 1)
    except KeyboardInterrupt:
        fail("interrupted; rerun the same command to resume", 130)
    return 0


def _say(line: str) -> None:
    print(line, flush=True)  # a job's log shows each wait as it starts


if __name__ == "__main__":
    sys.exit(main())
