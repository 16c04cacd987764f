"""bash_kernel without pexpect's 50 ms delay before every line sent to bash.

pexpect.spawn sleeps delaybeforesend (0.05 s) before each send; bash_kernel sends its
~40-line helper script at start-up (about 2 s) and every line of user code one by one.
"""
import pexpect
from bash_kernel.kernel import BashKernel as _BashKernel


class BashKernel(_BashKernel):
    def _start_bash(self):
        orig_init = pexpect.spawn.__init__

        def init(spawn, *args, **kwargs):
            orig_init(spawn, *args, **kwargs)
            spawn.delaybeforesend = None

        pexpect.spawn.__init__ = init
        try:
            super()._start_bash()
        finally:
            pexpect.spawn.__init__ = orig_init
