# IPython in the code-interpreter template's kernels (read from /etc/ipython whatever HOME is):
# tracebacks without ANSI colours (clients show them as text), long results never elided, and
# the result formats e2b's SDKs read (sandbox_gateway_display).
c = get_config()  # noqa: F821 (IPython provides it)
c.InteractiveShell.colors = "NoColor"
c.PlainTextFormatter.max_seq_length = 0
c.InteractiveShellApp.extensions = ["sandbox_gateway_display"]
