#!/usr/bin/env python3
"""scripts/plot_run on metrics files as kills, resumes and mistakes leave them: a torn line is
skipped with a warning and the rest plotted; records of steps a resumed run trained again give way
to the new ones; a non-finite loss (written as null) plots; a file that is not a metrics.jsonl
(binary, empty, a JSON array, a record without its step or loss) is exit 2 naming it, never a
traceback."""
import csv
import json
import os
import subprocess
import tempfile
import unittest

SOURCE = os.environ.get("SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PLOT = os.path.join(SOURCE, "scripts", "plot_run")
PY = "/usr/bin/python3"  # Debian's, with python3-matplotlib


def step(n, loss=1.0):
    return json.dumps({"type": "step", "step": n, "loss": loss, "lr": 0.1, "samples_per_s": 100.0,
                       "time": 1000.0 + n, "data_wait_s": 0.001}) + "\n"


class PlotRun(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def plot(self, content):
        """(exit status, stderr, CSV rows) of plot_run on a metrics.jsonl holding `content`."""
        path = os.path.join(self.d, "metrics.jsonl")
        with open(path, "wb") as f:
            f.write(content if isinstance(content, bytes) else content.encode())
        table = os.path.join(self.d, "out.csv")
        if os.path.exists(table):
            os.remove(table)
        p = subprocess.run([PY, PLOT, self.d, "--out", os.path.join(self.d, "out.png"), "--csv", table],
                           capture_output=True, text=True, timeout=120)
        self.assertNotIn("Traceback", p.stderr)
        rows = []
        if os.path.exists(table):
            with open(table) as f:
                rows = list(csv.DictReader(f))
        return p.returncode, p.stderr, rows

    def test_torn_lines_are_skipped_with_a_warning(self):
        # A torn record glued to the next one (older builds appended after it), and a torn last line.
        rc, err, rows = self.plot(step(1) + '{"type":"step","st' + step(2) + step(3) + '{"type":"step","step":4,"lo')
        self.assertEqual(rc, 0, err)
        self.assertRegex(err, r"metrics\.jsonl:2: skipped a line that is not JSON")
        self.assertRegex(err, r"metrics\.jsonl:4: skipped a line that is not JSON")
        self.assertEqual([int(r["step"]) for r in rows], [1, 3])

    def test_redone_steps_give_way_to_the_resumed_run(self):
        resume = json.dumps({"type": "resume", "step": 2}) + "\n"
        rc, err, rows = self.plot(step(1) + step(2) + step(3, 9.0) + step(4, 9.0) + resume + step(3) + step(4))
        self.assertEqual(rc, 0, err)
        self.assertEqual([(int(r["step"]), float(r["loss"])) for r in rows], [(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0)])
        # A file from before resume records: a step that is not after the previous one.
        rc, err, rows = self.plot(step(1) + step(2) + step(3, 9.0) + step(2) + step(3))
        self.assertEqual(rc, 0, err)
        self.assertEqual([(int(r["step"]), float(r["loss"])) for r in rows], [(1, 1.0), (2, 1.0), (3, 1.0)])

    def test_a_diverged_run_plots(self):
        diverged = json.dumps({"type": "diverged", "step": 3, "reason": "x", "checkpoint": None}) + "\n"
        eval_null = json.dumps({"type": "eval", "step": 3, "test_loss": None, "test_accuracy": None}) + "\n"
        rc, err, rows = self.plot(step(1) + step(2, None) + step(3, None) + eval_null + diverged)
        self.assertEqual(rc, 0, err)
        self.assertEqual([r["loss"] for r in rows], ["1.0", "", ""])

    def test_what_is_not_a_metrics_file_is_exit_2_naming_it(self):
        for content, says in ((b"\x89HDF\r\n\x1a\n\0\0\0\xff\xfe", "binary"),
                              (b"\xff\xfe\xfa not utf-8\n", "not UTF-8"),
                              ("", "empty"),
                              ("\n  \n", "empty"),
                              (json.dumps([json.loads(step(1)), json.loads(step(2))]), "JSON array"),
                              ("[\n" + step(1).strip() + "\n]\n", "JSON array"),
                              ('{"type":"step","step":1,"lr":0.1}\n', "'step' record without 'loss'"),
                              ('{"type":"step","loss":1.0}\n', "'step' record without 'step'"),
                              ('{"type":"step","step":"1","loss":1.0}\n', "not a number"),
                              ('{"type":"eval","step":1}\n', "'eval' record without 'test_loss'"),
                              ('5\n"text"\n', "no step or eval records")):
            with self.subTest(says=says):
                rc, err, _ = self.plot(content)
                self.assertEqual(rc, 2, err)
                self.assertIn("metrics.jsonl", err)
                self.assertIn(says, err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
