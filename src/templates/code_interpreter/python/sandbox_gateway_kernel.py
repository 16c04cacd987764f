"""The code-interpreter template's Python kernel launcher: ipykernel, adjusted in two ways.

No TCP socket when the connection file says transport=ipc. ipykernel's IOPubThread always
binds a PULL socket on tcp://127.0.0.1:<random> (the pipe that carries output of forked child
processes back to the kernel), whatever the transport; a TCP socket watched by an event loop
is what gVisor cannot checkpoint. Here that pipe is bound on an ipc path next to the kernel's
iopub socket instead.

Output that streams instead of piling up. ipykernel collects what a cell writes and sends it
every 0.2 s, however much it is: a loop printing gigabytes holds them all. Here a megabyte of
waiting output is sent at once, the writer waiting until it is handed over; and the IOPub
socket blocks instead of dropping messages when its reader (the sandbox's interpreter) falls
behind, so a slow client slows the cell down rather than growing any process. (The
kernelspec also fixes glibc's mmap threshold, so that the megabyte buffers this churns through
go back to the system instead of fragmenting the heap.)

Usage (kernelspec argv): python3 -m sandbox_gateway_kernel -f {connection_file}
    --IPKernelApp.outstream_class=sandbox_gateway_kernel.BoundedOutStream
"""

import os
import threading
import warnings

import zmq
from ipykernel import iostream
from zmq.eventloop.zmqstream import ZMQStream

# Output a stream may hold before its writer waits for it to be sent.
MAX_WAITING = 1 << 20
# Messages the IOPub socket queues for a slow reader before sends block.
IOPUB_QUEUE = 16


class BoundedOutStream(iostream.OutStream):
    """An OutStream that hands over its output once a megabyte waits."""

    # A writer waits as long as its reader is behind; an interrupt still ends the wait.
    flush_timeout = 24 * 3600

    def write(self, string):
        n = super().write(string)
        if self._is_master_process():
            with self._buffer_lock:
                waiting = sum(b.tell() for b in self._buffers.values())
            if waiting > MAX_WAITING:
                self.flush()
                self._sent()
        return n

    def _sent(self):
        # flush() returns once the IOPub thread has taken the output, but the thread sends it
        # in a callback of its own, queued behind: waiting for one more turn of that queue
        # waits for the send itself.
        thread = self.pub_thread
        if thread is not None and thread.thread is not None and thread.thread.is_alive():
            done = threading.Event()
            thread.schedule(done.set)
            done.wait(self.flush_timeout)


class IpcPipeIOPubThread(iostream.IOPubThread):
    """The IOPub thread with its fork pipe on ipc."""

    def _pipe_endpoint(self):
        ep = self.socket.getsockopt(zmq.LAST_ENDPOINT).decode()
        if ep.startswith("ipc://"):
            return f"{ep}-pipe-{os.getpid()}"
        return None

    def _setup_pipe_in(self):
        ep = self._pipe_endpoint()
        if ep is None:
            return super()._setup_pipe_in()
        self._pipe_uuid = os.urandom(16)
        pipe_in = self.socket.context.socket(zmq.PULL)
        pipe_in.linger = 0
        try:
            pipe_in.bind(ep)
        except zmq.ZMQError as e:
            warnings.warn(f"Couldn't bind IOPub pipe to {ep}: {e}", stacklevel=2)
            self._pipe_flag = False
            pipe_in.close()
            return None
        self._pipe_ep = ep
        self._pipe_in = ZMQStream(pipe_in, self.io_loop)
        self._pipe_in.on_recv(self._handle_pipe_msg)
        return None

    def _setup_pipe_out(self):
        ep = getattr(self, "_pipe_ep", None)
        if ep is None:
            return super()._setup_pipe_out()
        ctx = zmq.Context()
        pipe_out = ctx.socket(zmq.PUSH)
        pipe_out.linger = 3000
        pipe_out.connect(ep)
        return ctx, pipe_out


def main():
    import sys
    from pathlib import Path

    # `python -m` puts the working directory first on sys.path; a user's file named like a
    # module of the kernel must not replace it.
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]
    from ipykernel import kernelapp

    class SandboxKernelApp(kernelapp.IPKernelApp):
        def _bind_socket(self, s, port):
            # Options of a socket that listens apply to the connections it takes only when
            # set before it binds.
            if s.type == zmq.PUB:
                s.setsockopt(zmq.SNDHWM, IOPUB_QUEUE)
                s.setsockopt(zmq.XPUB_NODROP, 1)
            return super()._bind_socket(s, port)

    kernelapp.IOPubThread = IpcPipeIOPubThread
    SandboxKernelApp.launch_instance()


if __name__ == "__main__":
    main()
