package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/planner"
)

// runCLI runs the command line in-process and returns its exit code, stdout
// and stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(context.Background(), args, &out, &errb)
	code := exitCode(err, &errb)
	return code, out.String(), errb.String()
}

// long leaves a test out of 'go test -short', whose representative subset
// of the end-to-end tests runs in well under a minute; the full suite runs
// them all.
func long(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: one of the longer end-to-end tests")
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	// A shard cut short: its header promises more tokens than it holds.
	shards := filepath.Join(dir, "shards")
	if err := os.MkdirAll(shards, 0o755); err != nil {
		t.Fatal(err)
	}
	good := make([]uint16, 1000)
	if err := data.WriteShard(filepath.Join(shards, "data_000000.bin"), good); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(shards, "data_000000.bin"))
	os.WriteFile(filepath.Join(shards, "data_000000.bin"), b[:len(b)-100], 0o644)
	notModel := filepath.Join(dir, "notmodel.bin")
	os.WriteFile(notModel, make([]byte, 2048), 0o644)
	badYAML := filepath.Join(dir, "bad.yaml")
	os.WriteFile(badYAML, []byte("_base_: tiny\nModel:\n  hidden_size: abc\n"), 0o644)

	logs := "Engine.log_dir=" + filepath.Join(dir, "log")
	h := hostileFiles(t, dir)
	out := filepath.Join(dir, "out")
	tests := []struct {
		name string
		args []string
		want []string // substrings of the one-line error
	}{
		{"no command", nil, []string{"no command"}},
		{"unknown command", []string{"trian"}, []string{"unknown command", "trian"}},
		{"unknown key", []string{"train", "-c", "tiny", "-o", "Model.hiden_size=3"}, []string{"Model.hiden_size", "Model.hidden_size"}},
		{"bad override syntax", []string{"train", "-c", "tiny", "-o", "Model.hidden_size"}, []string{"Model.hidden_size"}},
		{"missing config", []string{"train", "-c", filepath.Join(dir, "nope.yaml")}, []string{"nope.yaml"}},
		{"bad value type", []string{"train", "-c", badYAML}, []string{"bad.yaml:3", "hidden_size"}},
		{"heads do not divide", []string{"train", "-c", "tiny", "-o", "Model.hidden_size=66"}, []string{"hidden_size"}},
		{"missing data dir", []string{"train", "-c", "tiny", "-o", logs, "-o", "Data.Train.dataset.input_dir=" + filepath.Join(dir, "nodata")}, []string{"nodata"}},
		{"truncated shard", []string{"train", "-c", "tiny", "-o", logs, "-o", "Data.Train.dataset.input_dir=" + shards}, []string{"data_000000.bin"}},
		{"missing model file", []string{"train", "-c", "tiny", "-o", logs, "-o", "Model.init_from=" + filepath.Join(dir, "nomodel.bin")}, []string{"nomodel.bin"}},
		{"not a model file", []string{"train", "-c", "tiny", "-o", logs, "-o", "Model.init_from=" + notModel}, []string{"notmodel.bin", "magic"}},
		{"gpu without CUDA", []string{"train", "-c", "tiny", "-o", "Global.device=gpu"}, []string{"Global.device=gpu", "libcuda.so not found", "use Global.device=cpu"}},
		{"dp2 in one process", []string{"train", "-c", "tiny", "-o", logs, "-o", "Distributed.dp_degree=2", "-o", "Global.local_batch_size=4", "-o", "Global.micro_batch_size=4"}, []string{"dp_degree 2", "gptui run --no-tui --nproc 2"}},
		{"mp does not divide heads", []string{"train", "-c", "tiny", "-o", logs, "-o", "Distributed.mp_degree=3"}, []string{"num_attention_heads", "mp_degree (3)"}},
		{"pp does not divide layers", []string{"train", "-c", "tiny", "-o", logs, "-o", "Distributed.pp_degree=3"}, []string{"num_layers", "pp_degree (3)"}},
		{"mp2 in one process", []string{"train", "-c", "tiny", "-o", logs, "-o", "Distributed.mp_degree=2"}, []string{"mp_degree 2", "gptui run --no-tui --nproc 2"}},
		{"keep-jobs zero", []string{"run", "--no-tui", "--hosts", filepath.Join(dir, "hosts.txt"), "-c", "tiny", "--keep-jobs", "0"}, []string{"--keep-jobs 0", "-1 for all"}},
		{"keep-jobs without hosts", []string{"run", "--no-tui", "-c", "tiny", "--keep-jobs", "3"}, []string{"--keep-jobs", "need --hosts FILE"}},
		{"stray argument after flags", []string{"train", "-c", "tiny", "extra"}, []string{`unexpected argument "extra"`}},
		{"hf n_layer 1e9", []string{"import", "--from", "hf", "--out", out, h.hfDir}, []string{"config.json", "n_layer 1000000000"}},
		{"llm.c C=262144 in 64 KiB", []string{"import", "--from", "llmc", "--out", out, h.llmc}, []string{"wide.bin", "C (header[6]) 262144"}},
		{"llm.c header beyond its file", []string{"import", "--from", "llmc", "--out", out, h.llmcShort}, []string{"short.bin", "has 411627520 parameters", "the file holds 64512 bytes"}},
		{"llm.c C=262144 as init_from", []string{"train", "-c", "tiny", "-o", logs, "-o", "Model.init_from=" + h.llmc}, []string{"wide.bin", "C (header[6]) 262144"}},
		{"generate, manifest num_layers 1e6", []string{"generate", "--ckpt", h.ckpt1e6, "--prompt", "a"}, []string{"manifest.json", "Model.num_layers", "1000000"}},
		{"generate, manifest num_layers 1e4", []string{"generate", "--ckpt", h.ckpt1e4, "--prompt", "a"}, []string{"manifest.json", "num_layers 10000", "params/ln1w"}},
		{"export, manifest num_layers 1e4", []string{"export", "--ckpt", h.ckpt1e4, "--to", "hf", out}, []string{"manifest.json", "num_layers 10000"}},
		{"max_seq_len 1e9", []string{"train", "-c", "tiny", "-o", logs, "-o", "Data.Train.dataset.max_seq_len=1e9", "-o", "Model.max_position_embeddings=1e9"}, []string{"Data.Train.dataset.max_seq_len"}},
		{"eval token outside the vocabulary", []string{"train", "-c", "tiny", "-o", logs, "-o", "Data.Train.dataset.input_dir=" + h.trainData, "-o", "Data.Eval.dataset.input_dir=" + h.evalData},
			[]string{filepath.Join(h.evalData, "data_000000.bin"), "token 50290 at byte offset 1038"}},
		{"missing prepare input", []string{"data", "prepare", "--input", filepath.Join(dir, "none.txt"), "--output", filepath.Join(dir, "o")}, []string{"none.txt"}},
		{"prepare input without text", []string{"data", "prepare", "--input", shards, "--output", filepath.Join(dir, "o")}, []string{"no .txt or .jsonl files found in " + shards}},
	}
	if planner.MemTotal() > 0 { // the machine's memory is known (Linux): 13 TB cannot fit it
		tests = append(tests, struct {
			name string
			args []string
			want []string
		}{"beyond this machine's memory", []string{"train", "-c", "tiny", "-o", logs, "-o", "Model.num_layers=16000", "-o", "Model.hidden_size=2048"}, []string{"GiB", "this machine", "Model.num_layers", "Global.micro_batch_size"}})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tc.args...)
			checkUserError(t, code, stderr, tc.want)
			if strings.Contains(stdout, "[model]") {
				t.Errorf("the run started (stdout %q): bad input must be refused before step 0", stdout)
			}
			if testing.Verbose() {
				t.Log(strings.TrimSpace(stderr))
			}
		})
	}
}

// checkUserError asserts the bad-input contract: exit code 2 and stderr
// ending in one 'gptui: ' line that mentions every string of want, with no
// stack trace.
func checkUserError(t *testing.T, code int, stderr string, want []string) {
	t.Helper()
	if code != 2 {
		t.Errorf("exit code %d, want 2 (stderr %q)", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "gptui: ") {
		t.Errorf("stderr %q does not end in a 'gptui: ' error line", stderr)
	}
	for _, w := range want {
		if !strings.Contains(last, w) {
			t.Errorf("error line %q does not mention %q", last, w)
		}
	}
	if strings.Contains(stderr, "goroutine ") || strings.Contains(stderr, "panic") {
		t.Errorf("stderr holds a stack trace: %q", stderr)
	}
}

// TestPrepareThenTrain: prepare a text file into shards and train on them.
func TestPrepareThenTrain(t *testing.T) {
	dir := t.TempDir()
	txt := filepath.Join(dir, "a.txt")
	os.WriteFile(txt, []byte(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 400)), 0o644)
	code, out, stderr := runCLI(t, "data", "prepare", "--quiet", "--input", txt, "--output", filepath.Join(dir, "shards"))
	if code != 0 || !strings.Contains(out, "prepared 1 document from 1 file: ") {
		t.Fatalf("prepare: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	code, out, stderr = runCLI(t, "train", "-c", "tiny", "-o", "Engine.max_steps=2", "-o", "Engine.eval_freq=0",
		"-o", "Engine.log_dir="+filepath.Join(dir, "log"), "-o", "Data.Train.dataset.input_dir="+filepath.Join(dir, "shards"),
		"-o", "Engine.save_load.output_dir="+filepath.Join(dir, "out"))
	if code != 0 || !strings.Contains(out, "[done] steps: 2") {
		t.Fatalf("train: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
}

func TestConfigAndPresets(t *testing.T) {
	code, out, _ := runCLI(t, "config", "-c", "13b-4node", "-o", "Model.hidden_size=2560")
	if code != 0 || !strings.Contains(out, "hidden_size: 2560") || !strings.Contains(out, "num_layers: 40") {
		t.Errorf("config: exit %d, output %q", code, out)
	}
	code, out, _ = runCLI(t, "presets")
	for _, p := range []string{"tiny", "llama-tiny", "gpt2-124m", "345m-1card", "llama-1b", "1.3b-dp8", "6.7b-sharding16", "llama-8b-4node", "13b-4node"} {
		if code != 0 || !strings.Contains(out, p) {
			t.Errorf("presets: exit %d, output lacks %s", code, p)
		}
	}
	// A Llama 3 preset plans without its tokenizer.json.
	code, out, stderr := runCLI(t, "plan", "-c", "llama-8b-4node", "--top", "1")
	if code != 0 || !strings.Contains(out, "model: Llama 8.0B params") || !strings.Contains(out, "kv heads 8") || !strings.Contains(out, "cluster: 4 node(s) × 8") {
		t.Errorf("plan -c llama-8b-4node: exit %d, stderr %q, output %q", code, stderr, out)
	}
}

// TestTrainLogOnFullDisk: a metrics file on /dev/full is said once on
// stderr, training finishes and saves, and the exit status is 1.
func TestTrainLogOnFullDisk(t *testing.T) {
	dir := t.TempDir()
	logs, out := filepath.Join(dir, "log"), filepath.Join(dir, "out")
	os.MkdirAll(logs, 0o755)
	if err := os.Symlink("/dev/full", filepath.Join(logs, "metrics.0.jsonl")); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, append(append([]string{"train"}, small(t)...), "-o", "Engine.max_steps=1", "-o", "Engine.eval_freq=0", "-o", "Global.micro_batch_size=4",
		"-o", "Engine.log_dir="+logs, "-o", "Engine.save_load.save_steps=1", "-o", "Engine.save_load.output_dir="+out)...)
	if code != 1 {
		t.Errorf("exit %d, want 1 (stderr %q)", code, stderr)
	}
	if n := strings.Count(stderr, "metrics.0.jsonl: no space left on device"); n != 2 { // at the write, and at the end
		t.Errorf("stderr names the full metrics file %d times, want 2 (the report, the exit line):\n%s", n, stderr)
	}
	if !strings.Contains(stdout, "[done] checkpoint: "+filepath.Join(out, "step_00000001")) {
		t.Errorf("training did not finish with its checkpoint:\n%s", stdout)
	}
}

// TestEarlyRefusals: what every worker would refuse at its start is
// refused before a worker, or a detached job's supervisor, is started:
// exit 2, one line, no job id on stdout and no job folder.
func TestEarlyRefusals(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	hosts := filepath.Join(dir, "hosts.txt")
	if err := os.WriteFile(hosts, []byte("127.0.0.2 devices=cpu:1 workdir="+dir+"/n2\n127.0.0.3 devices=cpu:1 workdir="+dir+"/n3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dp2 := []string{"-o", "Distributed.dp_degree=2", "-o", "Global.local_batch_size=4", "-o", "Global.micro_batch_size=4"}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"detach, 3 workers for 2 ranks", append([]string{"run", "--detach", "--nproc", "3", "-c", "tiny"}, dp2...), []string{"dp_degree 2", "= 2 ranks, but the job has 3 process(es)"}},
		{"foreground, 3 workers for 2 ranks", append([]string{"run", "--no-tui", "--nproc", "3", "-c", "tiny"}, dp2...), []string{"dp_degree 2", "3 process(es)"}},
		{"hosts, 2 devices for 4 ranks", []string{"run", "--no-tui", "--hosts", hosts, "-c", "tiny", "-o", "Distributed.dp_degree=4", "-o", "Global.local_batch_size=2", "-o", "Global.micro_batch_size=2"}, []string{"dp_degree 4", "2 process(es)"}},
		{"a misspelt preset", []string{"run", "--detach", "--nproc", "1", "-c", "tiny2"}, []string{"tiny2", "did you mean the preset tiny?"}},
		{"a misspelt preset, train", []string{"train", "-c", "345m-1crad"}, []string{"did you mean the preset 345m-1card?"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tc.args...)
			checkUserError(t, code, stderr, tc.want)
			if stdout != "" {
				t.Errorf("stdout %q: a refused job prints no job id", stdout)
			}
			if _, err := os.Stat(filepath.Join(dir, "jobs")); !os.IsNotExist(err) {
				t.Errorf("a refused job left a jobs folder (%v)", err)
			}
		})
	}
}
