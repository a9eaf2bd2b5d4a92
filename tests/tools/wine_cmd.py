"""Run Windows batch files under wine's ``cmd`` for the launcher tests.

Each :class:`WineCmd` owns a throw-away wine prefix. Batch files run on a
pseudo-terminal: wine's console (and so ``chcp``) needs one, and keystrokes
answer ``pause``. Every run has a hard deadline; the process group and the
prefix's wineserver are killed at its end, whatever happened.
"""
import fcntl
import os
import os.path as osp
import pty
import re
import select
import shutil
import struct
import subprocess
import tempfile
import termios
import time
from typing import Callable, Dict, List, Optional

from tests.utils import kill_group, spawn, time_left_in_test

# wine's console draws blanks as cursor moves ("ESC [ n C").
_FORWARD = re.compile(r'\x1b\[(\d*)C')
MINGW = 'x86_64-w64-mingw32-gcc'
_ANSI = re.compile(r'\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][0-9A-Za-z]|\r')


def windows_path(path: str) -> str:
    """Unix path as wine's drive Z: sees it."""
    return 'Z:' + osp.abspath(path).replace('/', '\\')


def wine_unavailable() -> Optional[str]:
    """Why the batch files cannot run here under wine's cmd, or None."""
    missing = [tool for tool in ('wine', 'wineserver', MINGW)
               if shutil.which(tool) is None]
    if missing:
        return (f'{" and ".join(missing)} not installed: the Windows launcher '
                'tests (tools/*.bat under cmd) did NOT run. On Debian: '
                'apt-get install wine wine64 gcc-mingw-w64-x86-64-win32 '
                '(.ci/run does this when it can).')
    return None


class WineResult:

    def __init__(self, returncode: int, output: str, timed_out: bool):
        self.returncode = returncode
        self.output = output
        self.timed_out = timed_out

    @property
    def flat(self) -> str:
        """The output without line breaks: wine's console breaks long lines
        (and the next one) at its own width, whatever the terminal's."""
        return self.output.replace('\r', '').replace('\n', '')

    def __repr__(self):
        return (f'WineResult(rc={self.returncode}, '
                f'timed_out={self.timed_out},\n{self.output[-4000:]})')


#: variables that tools/setup_env.* read
SETUP_VARIABLES = ('MMSAFE_TORCH', 'MMSAFE_TORCH_INDEX', 'MMSAFE_MMCV_INDEX',
                   'MMSAFE_GPU', 'MMSAFE_CACHE_DIR', 'MMSAFE_VENV',
                   'MMSAFE_PYTHON', 'MMSAFE_FORCE')


class WineCmd:
    """A wine prefix in a temporary directory; ``close()`` removes it."""

    def __init__(self, timeout: float = 180):
        self.root = tempfile.mkdtemp(prefix='mmsafe_wine_')
        # The set-up's own choices (MMSAFE_TORCH under `make test-newest`,
        # ...) must not reach the scripts under test.
        self.env = {k: v for k, v in os.environ.items()
                    if k not in SETUP_VARIABLES}
        self.env.update(
            WINEPREFIX=osp.join(self.root, 'prefix'), WINEDEBUG='-all',
            WINEDLLOVERRIDES='mscoree,mshtml=', DISPLAY='',
            WAYLAND_DISPLAY='')
        init = self._spawn(['wine', 'cmd', '/c', 'ver'], self.env, timeout)
        if init.returncode != 0:
            self.close()
            raise RuntimeError(f'wine could not create its prefix: {init!r}')

    def set_browser(self, command: str) -> None:
        """Make ``start URL`` run the Unix ``command URL``."""
        result = self._spawn(
            ['wine', 'reg', 'add', r'HKCU\Software\Wine\WineBrowser', '/v',
             'Browsers', '/t', 'REG_SZ', '/d', command, '/f'], self.env, 60)
        assert result.returncode == 0, result

    def run(self, cmdline: List[str], cwd: str, path_first: List[str] = (),
            env: Optional[Dict[str, str]] = None, timeout: float = 120,
            until: Optional[Callable[[], bool]] = None) -> WineResult:
        """Run ``wine cmd /c`` + ``cmdline`` in ``cwd``, with ``path_first``
        (Unix folders) at the front of the Windows PATH. ``until``: after
        cmd exits, wait (within ``timeout``) until it holds, for programs
        that the batch file started in their own window."""
        full_env = dict(self.env)
        full_env['WINEPATH'] = ';'.join(windows_path(p) for p in path_first)
        full_env.update(env or {})
        return self._spawn(['wine', 'cmd', '/c', *cmdline], full_env, timeout,
                           cwd=cwd, until=until)

    def _spawn(self, argv, env, timeout, cwd=None,
               until=None) -> WineResult:
        master, slave = pty.openpty()
        # A wide terminal: wine's console wraps lines at the terminal width,
        # and the output is compared line by line.
        fcntl.ioctl(slave, termios.TIOCSWINSZ,
                    struct.pack('HHHH', 50, 1000, 0, 0))
        try:
            proc = spawn(argv, cwd=cwd, env=env, stdin=slave, stdout=slave,
                         stderr=slave)
        finally:
            os.close(slave)
        chunks = []
        deadline = time.monotonic() + time_left_in_test(timeout)
        next_key = time.monotonic() + 1
        timed_out = False
        try:
            while True:
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                ready, _, _ = select.select([master], [], [], 0.2)
                if ready:
                    try:
                        data = os.read(master, 65536)
                    except OSError:  # EIO: every writer closed the pty
                        data = b''
                    if data:
                        chunks.append(data)
                    elif proc.poll() is not None:
                        break
                elif proc.poll() is not None:
                    break
                if time.monotonic() > next_key:
                    # Answers "Press any key to continue".
                    os.write(master, b'\r')
                    next_key = time.monotonic() + 1
            while (not timed_out and until is not None and not until()):
                timed_out = time.monotonic() > deadline
                time.sleep(0.2)
        finally:
            self._kill(proc)
            os.close(master)
        output = b''.join(chunks).decode('utf-8', 'replace')
        output = _FORWARD.sub(lambda m: ' ' * int(m.group(1) or 1), output)
        output = _ANSI.sub('', output)
        return WineResult(proc.returncode if not timed_out else -9, output,
                          timed_out)

    def _kill(self, proc) -> None:
        kill_group(proc.pid)
        proc.wait()
        # Windows programs started with "start" outlive cmd: end them all.
        subprocess.run(['wineserver', '-k'], env=self.env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=60, check=False)

    def close(self) -> None:
        subprocess.run(['wineserver', '-k'], env=self.env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=60, check=False)
        shutil.rmtree(self.root, ignore_errors=True)
