"""The code-interpreter template's Python kernel launcher: ipykernel with no TCP socket when
the connection file says transport=ipc.

ipykernel's IOPubThread always binds a PULL socket on tcp://127.0.0.1:<random> (the pipe
that carries output of forked child processes back to the kernel), whatever the transport.
Here that pipe is bound on an ipc path next to the kernel's iopub socket instead.
"""
import sys
from pathlib import Path

if __name__ == "__main__":
    if sys.path[0] == "" or Path(sys.path[0]) == Path.cwd():
        del sys.path[0]

    import os
    import warnings

    import zmq
    from zmq.eventloop.zmqstream import ZMQStream
    from ipykernel import iostream, kernelapp

    class IpcPipeIOPubThread(iostream.IOPubThread):
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
                return
            self._pipe_ep = ep
            self._pipe_in = ZMQStream(pipe_in, self.io_loop)
            self._pipe_in.on_recv(self._handle_pipe_msg)

        def _setup_pipe_out(self):
            ep = getattr(self, "_pipe_ep", None)
            if ep is None:
                return super()._setup_pipe_out()
            ctx = zmq.Context()
            pipe_out = ctx.socket(zmq.PUSH)
            pipe_out.linger = 3000
            pipe_out.connect(ep)
            return ctx, pipe_out

    kernelapp.IOPubThread = IpcPipeIOPubThread
    kernelapp.launch_new_instance()
