"""Third-party Python modules for meshtrain's scripts, with one clear message when one is missing.

The rule for every Python script in this repository:
  * it starts with `#!/usr/bin/env python3`: the python3 first on PATH runs it, so a virtualenv or
    conda environment works when it has the modules, and Debian's /usr/bin/python3 works after
    scripts/install_deps.sh;
  * it imports numpy, h5py, matplotlib and torch through require(), which on a missing module
    names the module, the interpreter that lacks it, the Debian package and the pip command, and
    exits with status 2 (the status of every bad-input error in meshtrain).

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
    from pydeps import require
    np, h5py = require("text_to_tokens", "numpy", "h5py")
"""
import importlib
import sys

APT_PACKAGE = {
    "numpy": "python3-numpy",
    "h5py": "python3-h5py",
    "matplotlib": "python3-matplotlib",
    "torch": "python3-torch",
}


def missing_message(script, module, error):
    top = module.split(".")[0]
    apt = APT_PACKAGE.get(top)
    how = f"apt install {apt} (Debian/Ubuntu, for /usr/bin/python3)" if apt else "install it"
    return (f"{script}: needs the Python module '{top}', which {sys.executable} cannot import ({error}).\n"
            f"  {how}, or `{sys.executable} -m pip install {top}` in this environment;\n"
            f"  scripts/install_deps.sh installs all of meshtrain's dependencies on Debian 12.")


def require(script, *modules):
    """Imports each module (dotted names allowed); returns one module or a tuple, in order."""
    out = []
    for name in modules:
        try:
            out.append(importlib.import_module(name))
        except ImportError as e:
            sys.stderr.write(missing_message(script, name, e) + "\n")
            sys.exit(2)
    return out[0] if len(out) == 1 else tuple(out)
