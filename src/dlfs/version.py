"""The DLFS release and its distribution name, importable without loading the client
(the daemon reports the version; the tools name the distribution in advice)."""

__version__ = "0.1.0"

# What `pip install` calls this package (the import name stays `dlfs`): "dlfs"
# on the package index is an unrelated project.
DISTRIBUTION = "dlfs-storage"


def missing_extra(who: str, extra: str, module: str) -> str:
    """The message for `who` (a command or module) run without optional dependency
    `module`, which the extra `extra` of the distribution installs."""
    return (f"{who} needs {module}, which is not installed; it comes with the '{extra}' "
            f"extra: pip install '{DISTRIBUTION}[{extra}]'")
