"""Convert an old checkpoint once, outside training, or check one.

mmsafe's training, testing and preflight load only the zip archive of a
plain ``torch.save`` (docs/user_guides/training_safety.md, "Converting an
old checkpoint")::

    python tools/convert_checkpoint.py OLD.pth NEW.pth   # legacy -> zip
    python tools/convert_checkpoint.py --check FILE.pth [FILE.pth ...]

A checkpoint in torch's legacy (non-zip) format of torch < 1.6 is read
with mmsafe's own checks (nothing of it runs) and written as a zip
archive. A tar or TorchScript file cannot be converted without trusting
it: the message says how to do that in an isolated environment.
``--check`` loads each file exactly as training would and prints what it
holds, or why it is refused.
"""
import argparse
import sys

def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Convert an old checkpoint to the format mmsafe loads, '
        'or check checkpoints (mmsafe)')
    parser.add_argument('files', nargs='+',
                        help='OLD NEW to convert; with --check, the files '
                        'to check')
    parser.add_argument('--check', action='store_true',
                        help='load each file as training would and say '
                        'what it holds or why it is refused')
    args = parser.parse_args(argv)
    if not args.check and len(args.files) != 2:
        parser.error('give OLD NEW to convert, or --check FILE ...')
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import mmsafe  # noqa: F401
    from mmsafe.checkpoint import (CheckpointFormatError,
                                   UntrustedCheckpointError)
    from mmsafe.checkpoint.convert import (check_checkpoint,
                                           convert_checkpoint)
    refused = (CheckpointFormatError, UntrustedCheckpointError,
               FileExistsError, FileNotFoundError)
    failed = 0
    if args.check:
        for path in args.files:
            try:
                print(f'{path}: loads as plain data: '
                      f'{check_checkpoint(path)}')
            except refused as err:
                failed += 1
                print(f'{path}: {type(err).__name__}: {err}')
        return 1 if failed else 0
    try:
        _, what = convert_checkpoint(*args.files)
    except refused as err:
        print(f'{type(err).__name__}: {err}', file=sys.stderr)
        return 1
    print(what)
    return 0


def console_main() -> int:
    """The ``mmsafe-convert-checkpoint`` command."""
    return main()


if __name__ == '__main__':
    sys.exit(console_main())
