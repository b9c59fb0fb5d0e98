"""From a ``pip install --dry-run --report`` resolution, print ``name==version`` of every package the
requested ones need without passing through an excluded one (torch and what only it needs stay the
target's), markers evaluated for the target (CPython, Linux x86-64, ``--python``). Used by wheelhouse.sh.
"""

import argparse
import json

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def target_environment(python_version):
    """packaging's marker environment of CPython ``python_version`` on Linux x86-64."""
    return {**default_environment(), "python_version": python_version, "python_full_version": f"{python_version}.0",
            "implementation_name": "cpython", "implementation_version": f"{python_version}.0",
            "platform_python_implementation": "CPython", "sys_platform": "linux", "os_name": "posix",
            "platform_system": "Linux", "platform_machine": "x86_64"}


def applies(requirement, environment, extra):
    return requirement.marker is None or requirement.marker.evaluate({**environment, "extra": extra})


def needed(report, python_version, excluded):
    """``name==version`` of the requested packages' dependencies, excluded ones cut off."""
    resolved = {canonicalize_name(item["metadata"]["name"]): item for item in report["install"]}
    environment = target_environment(python_version)
    pending = [(name, extra) for name, item in resolved.items() if item.get("requested")
               for extra in [""] + list(item.get("requested_extras") or [])]
    seen = set()
    while pending:
        name, extra = pending.pop()
        if (name, extra) in seen or name in excluded:
            continue
        seen.add((name, extra))
        for line in resolved[name]["metadata"].get("requires_dist") or []:
            requirement = Requirement(line)
            if applies(requirement, environment, extra):
                dependency = canonicalize_name(requirement.name)
                pending += [(dependency, e) for e in [""] + sorted(requirement.extras)]
    names = {name for name, _ in seen if not resolved[name].get("requested")}
    return sorted(f"{resolved[name]['metadata']['name']}=={resolved[name]['metadata']['version']}" for name in names)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", help="the JSON written by pip install --dry-run --report")
    parser.add_argument("--python", required=True, help="target Python, e.g. 3.12")
    parser.add_argument("--exclude", default="torch", help="comma-separated package names the target already has")
    args = parser.parse_args(argv)
    with open(args.report) as handle:
        report = json.load(handle)
    excluded = {canonicalize_name(name.strip()) for name in args.exclude.split(",") if name.strip()}
    for line in needed(report, args.python, excluded):
        print(line)


if __name__ == "__main__":
    main()
