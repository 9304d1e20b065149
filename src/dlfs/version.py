"""The DLFS release, its distribution name and how to install it, importable without
loading the client (the daemon reports the version; the tools give the install line in
advice)."""

__version__ = "0.1.0"

# What `pip install` calls this package (the import name stays `dlfs`): "dlfs"
# on the package index is an unrelated project.
DISTRIBUTION = "dlfs-storage"


def install_line(extras: str) -> str:
    """The command that installs DLFS with `extras` ("fuse,torch"): from a checkout, as
    DISTRIBUTION is not on the package index yet (README.md, "Install")."""
    return f"pip install '.[{extras}]'"


def missing_extra(who: str, extra: str, module: str) -> str:
    """The message for `who` (a command or module) run without optional dependency
    `module`, which the extra `extra` of the distribution installs."""
    return (f"{who} needs {module}, which is not installed; it comes with the '{extra}' "
            f"extra: {install_line(extra)} in a checkout of DLFS ({DISTRIBUTION} is not "
            "on the package index yet)")
