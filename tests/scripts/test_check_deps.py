#!/usr/bin/env python3
"""scripts/check_deps: the tree's dependencies point down, and the checker notices when one does not
(an include or a link line upward or sideways)."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.environ.get("SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CHECK = os.path.join(SOURCE, "scripts", "check_deps")


def run(root):
    p = subprocess.run([sys.executable, CHECK, "--root", root], capture_output=True, text=True)
    return p.returncode, p.stdout


class CheckDeps(unittest.TestCase):
    def test_tree_points_down(self):
        rc, out = run(SOURCE)
        self.assertEqual(rc, 0, out)

    def make_tree(self, files):
        root = tempfile.mkdtemp(prefix="check_deps_")
        self.addCleanup(shutil.rmtree, root)
        base = dict(files)
        for rel, text in base.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        return root

    def test_clean_synthetic_tree(self):
        rc, out = run(self.make_tree({"data/Loader.h": '#include "core/Batch.h"\n#include "comm/Work.h"\n',
                                      "launch/Trainer.cpp": '#include "models/Model.h"\n#include "data/Loader.h"\n'}))
        self.assertEqual(rc, 0, out)

    def test_upward_include_fails(self):
        rc, out = run(self.make_tree({"core/Tensor.h": '#include <vector>\n\n#include "comm/Work.h"\n'}))
        self.assertEqual(rc, 1)
        self.assertIn("core/Tensor.h:3: core includes comm/ (comm is above it)", out)

    def test_sibling_include_fails(self):
        rc, out = run(self.make_tree({"data/Loader.h": '#include "models/Model.h"\n'}))
        self.assertEqual(rc, 1)
        self.assertIn("data includes models/ (models is a sibling)", out)

    def test_upward_link_fails(self):
        rc, out = run(self.make_tree({"topo/CMakeLists.txt": "target_link_libraries(mt_topo PUBLIC mt_launch mt_core)\n"}))
        self.assertEqual(rc, 1)
        self.assertIn("mt_topo links mt_launch", out)

    def test_sideways_link_fails(self):
        rc, out = run(self.make_tree({"sharding/CMakeLists.txt": "target_link_libraries(mt_sharding PUBLIC mt_models)\n"}))
        self.assertEqual(rc, 1)
        self.assertIn("mt_sharding links mt_models", out)


if __name__ == "__main__":
    unittest.main()
