#!/usr/bin/env python3
"""End-to-end checks of build/bin/trainer: bad input gives one clear line and exit code 2 on every
rank; a short run writes config.ini, metrics.jsonl and the final line."""
import json
import os
import subprocess
import tempfile
import time
import unittest

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
VARIANTS = os.environ["H5_VARIANTS"]
SRC = os.environ["SOURCE_DIR"]


def run(args, np=1, timeout=300, env=None):
    cmd = ([TRAINER] if np == 1 else ["mpirun", "-np", str(np), TRAINER]) + args
    e = dict(os.environ, **(env or {}))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
    return p.returncode, p.stdout, p.stderr


def error_lines(stderr):
    return [l for l in stderr.splitlines() if "error" in l]


class BadInput(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def ini(self, text):
        path = os.path.join(self.dir, "run.ini")
        with open(path, "w") as f:
            f.write(text)
        return path

    def expect_error(self, args, needles, np=1):
        code, out, err = run(args + [f"--run.dir={self.dir}"], np=np)
        self.assertEqual(code, 2, f"exit code {code}\n{err}")
        lines = error_lines(err)
        self.assertEqual(len(lines), 1, f"expected one error line:\n{err}")
        for n in needles:
            self.assertIn(n, lines[0])
        return lines[0]

    def test_unknown_key_in_file(self):
        path = self.ini("[train]\nepochs = 1\nlrr = 0.1\n")
        self.expect_error(["--config", path], [path, "unknown key 'train.lrr'"])

    def test_unknown_section_key(self):
        path = self.ini("[trian]\nepochs = 1\n")
        self.expect_error(["--config", path], [path, "unknown key 'trian.epochs'"])

    def test_unknown_override(self):
        self.expect_error(["--train.epoch=3"], ["--train.epoch", "unknown key", "did you mean 'train.epochs'?"])
        path = self.ini("[train]\nbatch_sise = 64\n")
        self.expect_error(["--config", path], [path, "did you mean 'train.batch_size'?"])

    def test_help_lists_subcommands_and_each_prints_usage(self):
        code, out, err = run(["--help"])
        self.assertEqual(code, 0, err)
        for needle in ("--help-env", "--devices", "topo --help", "predict --help", "export --help", "logits --help"):
            self.assertIn(needle, out)
        for sub in ("topo", "predict", "export", "logits"):
            code, out, err = run([sub, "--help"])
            self.assertEqual(code, 0, err)
            self.assertTrue(out.startswith(f"usage: trainer {sub}"), out)

    def test_model_too_large_for_the_machine_exits_2(self):
        self.expect_error([f"--data.path={FASHION}", "--model.hidden=10000000"],
                          ["model.hidden", "parameters need", "more than this machine's"])
        # The key that makes the model big is the one named (a CNN's channels, not model.hidden),
        # and sizes whose products would overflow int64 are refused before anything is built.
        cnn = [f"--data.path={FASHION}", "--model.type=cnn"]
        self.expect_error(cnn + ["--model.conv_channels=100000"],
                          ["model.conv_channels", "parameters need", "more than this machine's"])
        self.expect_error(cnn + ["--model.fc=16000000"], ["model.fc", "parameters need"])
        self.expect_error(cnn + ["--model.conv_channels=16000000,16000000", "--model.kernel=255"],
                          ["model.conv_channels", "parameters: more than any machine holds"])
        self.expect_error([f"--data.path={FASHION}", "--model.hidden=3037000500,3037000500"],
                          ["model.hidden", "widths must be in [1, 2^24]"])
        for key, value in (("model.fc", 2 ** 63 - 1), ("model.layers", 100000), ("model.channels", 2 ** 32),
                           ("model.heads", 2 ** 63 - 1), ("model.vocab_size", 2 ** 63 - 1)):
            self.expect_error([f"--data.path={FASHION}", f"--{key}={value}"], [f"--{key}={value}", "must be in"])

    def test_bad_override_is_named_as_the_override(self):
        path = self.ini("[train]\nepochs = 1\n")
        line = self.expect_error(["--config", path, "--train.epochs=abc"], ["--train.epochs=abc", "not an integer"])
        self.assertNotIn(path, line)
        self.expect_error(["--config", self.ini("[train]\nepochs = abc\n")], ["run.ini", "train.epochs = 'abc'"])

    def test_script_variables_are_not_unknown(self):
        # MT_PROFILE & co. are read by scripts/slurm; only a real typo is reported.
        code, out, err = run(["--train.max_steps=1", f"--data.path={FASHION}", f"--run.dir={self.dir}"],
                             env={"MT_PROFILE": "ib-ndr", "MT_REQUEUE": "0", "MT_LOG_LEVL": "debug"})
        self.assertEqual(code, 0, err)
        self.assertNotIn("unknown environment variable MT_PROFILE", out + err)
        self.assertNotIn("MT_REQUEUE", out + err)
        self.assertIn("unknown environment variable MT_LOG_LEVL", out + err)

    def test_bad_values(self):
        self.expect_error(["--train.batch_size=abc"], ["--train.batch_size=abc", "not an integer"])
        self.expect_error(["--optim.lr=-1"], ["--optim.lr=-1", "must be positive"])
        self.expect_error(["--model.type=resnet"], ["--model.type=resnet", "expected one of mlp, cnn, gpt"])
        self.expect_error(["--data.shuffle=maybe"], ["data.shuffle", "not a boolean"])
        path = self.ini("[model]\nhidden = 256,x\n")
        self.expect_error(["--config", path], [path, "model.hidden = '256,x'"])

    def test_missing_files(self):
        missing = os.path.join(self.dir, "nope.ini")
        self.expect_error(["--config", missing], [missing, "No such file"])
        self.expect_error([f"--data.path={self.dir}/nope.h5"], [f"{self.dir}/nope.h5", "No such file"])

    def test_bad_dataset(self):
        bad = os.path.join(VARIANTS, "bad_dtype.h5")
        self.expect_error([f"--data.path={bad}"], [bad, "/train/images has type f32, expected u8"])

    def test_bad_files_exit_2_on_every_rank(self):
        # Both ranks fail alike; the job ends with one line naming the file and the dataset.
        for variant, needle, mode in [("truncated", "truncated", "memory"), ("truncated_chunked", "truncated", "stream"),
                                      ("bad_dtype", "/train/images has type f32, expected u8", "stream"),
                                      ("missing_labels", "dataset /train/labels not found", "memory")]:
            bad = os.path.join(VARIANTS, variant + ".h5")
            self.expect_error([f"--data.path={bad}", f"--data.mode={mode}"], [bad, needle], np=2)

    def test_hostile_values_exit_2(self):
        # Non-finite numbers trained to NaN and exited 0; a huge timeout overflowed the deadline.
        for args, needles in [(["--optim.lr=inf"], ["--optim.lr=inf", "finite"]),
                              (["--optim.weight_decay=nan"], ["--optim.weight_decay=nan", "finite"]),
                              (["--model.input_mean=nan"], ["model.input_mean", "finite"]),
                              (["--model.input_std=inf"], ["model.input_std", "finite"]),
                              (["--dist.timeout_s=10000000000"], ["dist.timeout_s", "604800"])]:
            self.expect_error(args, needles)

    def test_bad_environment_exit_2_not_abort(self):
        # MT_NODE_SPLIT threw outside main's try (SIGABRT); MT_NUM_THREADS=100000 segfaulted.
        for env, needles, np in [({"MT_NODE_SPLIT": "3"}, ["MT_NODE_SPLIT=3 does not divide the world size 4"], 4),
                                 ({"MT_NODE_SPLIT": "abc"}, ["MT_NODE_SPLIT='abc' is not an integer"], 2),
                                 ({"MT_NUM_THREADS": "100000"}, ["MT_NUM_THREADS='100000' is out of range"], 1),
                                 ({"MT_COMM_TIMEOUT_S": "99999999999"}, ["MT_COMM_TIMEOUT_S", "out of range"], 1),
                                 # was ignored without a word (the run logged at info)
                                 ({"MT_LOG_LEVEL": "verbose"}, ["MT_LOG_LEVEL='verbose' is not a log level",
                                                                "debug, info, warn or error"], 2)]:
            code, out, err = run([f"--run.dir={self.dir}", "--train.max_steps=1"], np=np, env=env)
            self.assertEqual(code, 2, f"{env}: exit code {code}\n{err}")
            lines = error_lines(err)
            self.assertEqual(len(lines), 1, f"{env}: expected one error line:\n{err}")
            for n in needles:
                self.assertIn(n, lines[0])

    def test_bad_cpu_adam_variant_exit_2(self):
        # Read when the CPU optimizer is made, before the first step (core/optim/CpuAdam).
        code, out, err = run([f"--run.dir={self.dir}", "--train.max_steps=1", f"--data.path={FASHION}"],
                             env={"MT_CPU_ADAM": "avx9"})
        self.assertEqual(code, 2, f"exit code {code}\n{err}")
        lines = error_lines(err)
        self.assertEqual(len(lines), 1, err)
        self.assertIn("MT_CPU_ADAM='avx9' is not one of auto, scalar, avx2, avx512", lines[0])
        code, out, err = run([f"--run.dir={self.dir}-scalar", "--train.max_steps=2", f"--data.path={FASHION}"],
                             env={"MT_CPU_ADAM": "scalar"})
        self.assertEqual(code, 0, err)

    def test_hostile_data_files(self):
        for variant, needles, np in [
                ("declared_huge", ["/train/images declares [1000000000,28,28,1]", "chunks stored"], 2),
                ("label_out_of_range", ["/train/labels[57] = 12", "outside [0, 10)"], 1),
                ("label_negative", ["/train/labels[5] = -3"], 1),
                ("test_split_mismatch", ["split test has 32x32x1 images, split train 28x28x1"], 2)]:
            bad = os.path.join(VARIANTS, variant + ".h5")
            t0 = time.time()
            for mode in ("stream", "memory"):
                self.expect_error([f"--data.path={bad}", f"--data.mode={mode}"], [bad] + needles, np=np)
            self.assertLess(time.time() - t0, 120, variant)

    def test_run_name_stays_inside_run_dir(self):
        # run.name = .. wrote the run (lock, config.ini, metrics, checkpoints) into run.dir's parent.
        runs = os.path.join(self.dir, "runs")
        for name in ("..", ".", "a/../..", "/tmp/x"):
            code, out, err = run([f"--data.path={FASHION}", "--train.max_steps=1", f"--run.dir={runs}",
                                  f"--run.name={name}"], np=2)
            self.assertEqual(code, 2, f"{name}: exit code {code}\n{err}")
            lines = error_lines(err)
            self.assertEqual(len(lines), 1, err)
            self.assertIn(f"--run.name={name}: must be a plain name inside run.dir", lines[0])
            self.assertEqual([f for f in os.listdir(self.dir) if f != "runs"], [], f"{name}: written outside run.dir")

    def test_bad_count_attributes_and_token_ids_name_the_file(self):
        # num_classes / vocab_size that are no count were ignored; a token id outside the vocabulary
        # (or one a cast to int32 made negative) was "embedding index 150 out of range for
        # vocabulary 128", naming neither the file nor where in it.
        gpt = ["--config", os.path.join(SRC, "configs/gpt_tiny.ini"), "--train.max_steps=12",
               "--train.eval_interval=6"]
        mlp = ["--train.batch_size=20", "--train.max_steps=2"]  # 103 images; 205c237 trained on these
        for variant, needles, extra in [
                ("num_classes_zero", ["attribute num_classes of /train/labels = 0 is outside [1, 2147483647]"], mlp),
                ("num_classes_float", ["attribute num_classes of /train/labels is of type f64, expected one integer"],
                 mlp),
                ("num_classes_array", ["attribute num_classes of /train/labels is 2 values of i64"], mlp),
                ("tokens_vocab_huge", ["attribute vocab_size of / = 2147483648 is outside [1, 2147483647]"], gpt),
                ("tokens_beyond_vocab", ["dataset /train/tokens[3000] = 150 is outside [0, 100)", "vocab_size"], gpt),
                ("tokens_u32_wraps", ["dataset /train/tokens[40] = 2147483653 is outside [0, 2147483647)"], gpt),
                ("tokens_test_beyond_train", ["dataset /test/tokens[2000] = 180 is outside [0, 100)",
                                              "the model's vocabulary"], gpt)]:
            bad = os.path.join(VARIANTS, variant + ".h5")
            for mode in ("stream", "memory"):
                # A streamed bad id is met in training: its rank ends the job and the others say so,
                # all exiting 2 (abortJob), so the message is the one line naming the file.
                code, out, err = run(extra + [f"--data.path={bad}", f"--data.mode={mode}", f"--run.dir={self.dir}",
                                              f"--run.name={variant}-{mode}"], np=2)
                self.assertEqual(code, 2, f"{variant} {mode}: exit code {code}\n{err}")
                lines = [l for l in err.splitlines() if f"error: data file {bad}: " in l]
                self.assertTrue(lines, f"{variant} {mode}: no line naming the file\n{err}")
                for n in needles:
                    self.assertIn(n, lines[0], f"{variant} {mode}")

    def test_fletcher32_corruption_is_detected(self):
        # The checksum was stripped, not verified: a flipped byte trained silently.
        bad = os.path.join(VARIANTS, "fletcher_flipped.h5")
        for mode in ("memory", "stream"):
            code, out, err = run([f"--data.path={bad}", f"--data.mode={mode}", "--train.batch_size=20",
                                  "--train.max_steps=12", f"--run.dir={self.dir}", f"--run.name={mode}"], np=2)
            self.assertEqual(code, 2, f"{mode}: exit code {code}\n{err}")
            self.assertIn(f"{bad}: chunk at row 40 of /train/images fails its Fletcher-32 checksum", err, mode)

    def test_deep_topology_file_is_refused(self):
        path = os.path.join(self.dir, "deep.xml")
        with open(path, "w") as f:
            f.write('<system version="1">\n' + "<pci>" * 50000 + "</pci>" * 50000 + "\n</system>\n")
        self.expect_error([f"--topo.file={path}", f"--data.path={FASHION}"], [path, "nested deeper than 64"], np=2)
        code, out, err = run(["topo", "--file", path])
        self.assertEqual(code, 2, err)
        self.assertIn("nested deeper than 64", out + err)

    def test_unusable_checkpoint_dir_fails_at_setup(self):
        blocker = os.path.join(self.dir, "a_file")
        open(blocker, "w").close()
        t0 = time.time()
        self.expect_error([f"--checkpoint.dir={blocker}/ckpt", f"--data.path={FASHION}", "--train.max_steps=5"],
                          ["checkpoint.dir: cannot create", f"{blocker}/ckpt"], np=2)
        self.assertLess(time.time() - t0, 60)

    def test_every_rank_exits_2(self):
        line = self.expect_error(["--train.batch_size=3"], ["train.batch_size", "divide evenly over the 2 ranks"], np=2)
        self.assertIn("[r0]", line)
        missing = os.path.join(self.dir, "nope.h5")
        self.expect_error([f"--data.path={missing}"], [missing], np=2)


class ShortRun(unittest.TestCase):
    def test_writes_run_directory(self):
        with tempfile.TemporaryDirectory() as d:
            code, out, err = run(["--config", os.path.join(os.environ["SOURCE_DIR"], "configs/fashion_mlp.ini"),
                                  f"--data.path={FASHION}", f"--run.dir={d}", "--run.name=short",
                                  "--train.max_steps=40", "--run.log_interval=10", "--train.eval_batch_size=2000"],
                                 np=2)
            self.assertEqual(code, 0, err)
            final = [l for l in out.splitlines() if l.startswith("final ")]
            self.assertEqual(len(final), 1, out)
            self.assertRegex(final[0], r"^final test_accuracy=0\.\d{4} test_loss=\d+\.\d{4}$")
            acc = float(final[0].split()[1].split("=")[1])
            self.assertGreater(acc, 0.5)  # 40 steps of Adam already learn most of it
            records = [json.loads(l) for l in open(os.path.join(d, "short", "metrics.jsonl"))]
            steps = [r for r in records if r["type"] == "step"]
            self.assertEqual([r["step"] for r in steps], [10, 20, 30, 40])
            self.assertLess(steps[-1]["loss"], steps[0]["loss"])
            for key in ("loss", "lr", "samples_per_s", "data_wait_s", "epoch"):
                self.assertIn(key, steps[0])
            self.assertEqual(records[-1]["type"], "final")
            # Startup says what it is doing, with sizes, before the first progress line.
            log = out + err
            self.assertRegex(log, r"data \S+fashion_mnist\.h5: 60000 train and 10000 test 28x28x1 images, 10 classes; "
                                  r"loading [\d.]+ MiB into memory")
            self.assertRegex(log, r"data in memory after [\d.e-]+ s")
            self.assertIn("building the mlp model on cpu", log)
            self.assertIn("step 1 of 40 (the first also makes the allocations and kernel plans)", log)
            self.assertRegex(log, r"first step done in [\d.e-]+ s")
            self.assertLess(log.index("building the mlp model"), log.index("step 10/40"))
            for key in ("allocated_bytes", "allocator_peak_bytes"):
                self.assertGreater(steps[0][key], 0)
            ini = open(os.path.join(d, "short", "config.ini")).read()
            self.assertIn("[train]\nepochs = 10\nmax_steps = 40\n", ini)
            # The resolved config reproduces the run.
            code2, out2, _ = run(["--config", os.path.join(d, "short", "config.ini"), "--run.name=again"], np=2)
            self.assertEqual(code2, 0)
            self.assertEqual([l for l in out2.splitlines() if l.startswith("final ")], final)


class Reruns(unittest.TestCase):
    def test_rerun_extends_refuses_or_does_nothing_never_negative(self):
        with tempfile.TemporaryDirectory() as d:
            base = [f"--data.path={FASHION}", f"--run.dir={d}", "--run.name=r", "--run.log_interval=10",
                    "--train.eval_batch_size=2000"]
            code, out, err = run(base + ["--train.max_steps=20"])
            self.assertEqual(code, 0, err)
            # Fewer steps than were done: refused, naming the directory and the ways out.
            code, out, err = run(base + ["--train.max_steps=10"])
            self.assertEqual(code, 2, err)
            self.assertIn(os.path.join(d, "r"), err)
            self.assertIn("past this configuration's 10 steps", err)
            self.assertIn("--checkpoint.resume=never", err)
            self.assertNotIn("trained -", out + err)
            # The same length: nothing trained, evaluated again.
            code, out, err = run(base + ["--train.max_steps=20"])
            self.assertEqual(code, 0, err)
            self.assertIn("nothing to train", out + err)
            self.assertIn("trained 0 steps", out + err)
            self.assertEqual(len([l for l in out.splitlines() if l.startswith("final ")]), 1)
            # Longer: continues from step 20.
            code, out, err = run(base + ["--train.max_steps=30"])
            self.assertEqual(code, 0, err)
            self.assertIn("at step 20", out + err)
            self.assertIn("trained 10 steps", out + err)
            steps = [json.loads(l)["step"] for l in open(os.path.join(d, "r", "metrics.jsonl"))
                     if json.loads(l)["type"] == "step"]
            self.assertEqual(steps[-1], 30)


class Docs(unittest.TestCase):
    def test_readme_lists_every_key_and_ci_runs_its_test_command(self):
        src = os.environ["SOURCE_DIR"]
        readme = open(os.path.join(src, "README.md")).read()
        code, out, _ = run(["--help"])
        self.assertEqual(code, 0)
        keys = [l.split(" = ")[0].strip() for l in out.splitlines() if l.startswith("  ") and " = " in l
                and not l.startswith("      ")]
        self.assertGreater(len(keys), 40)
        for k in keys:
            self.assertIn(f"`{k}`", readme, f"README's configuration reference lacks {k}")
        # The table is the config table's own rendering (scripts/update_config_reference rewrites it).
        code, table, _ = run(["--config-reference"])
        self.assertEqual(code, 0)
        start = readme.index("| key | default | meaning |")
        lines = []
        for line in readme[start:].splitlines(keepends=True):
            if not line.startswith("|"):
                break
            lines.append(line)
        self.assertEqual("".join(lines), table, "README's configuration reference is stale: "
                         "run scripts/update_config_reference")
        quick = readme.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
        commands = [l.split("#")[0].strip() for l in quick.strip().splitlines() if l.split("#")[0].strip()]
        self.assertEqual(len(commands), 2, commands)
        ci = open(os.path.join(src, ".ci/run")).read()
        self.assertIn(commands[1], ci)


if __name__ == "__main__":
    unittest.main(verbosity=2)
