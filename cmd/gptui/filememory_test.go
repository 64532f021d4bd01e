package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/hf"
	"github.com/gptui/gptui/engine/safetensors"
	"github.com/gptui/gptui/planner"
)

// Files cannot drive memory: a model file, a checkpoint's config or a
// tokenizer.json is checked against the memory the process may hold
// before anything it sizes is allocated, and read within a small multiple
// of its real content. These tests run the gptui binary and measure its
// peak resident memory (getrusage's ru_maxrss).

// measured is what runMeasured saw of one run of the gptui binary.
type measured struct {
	code           int
	stdout, stderr string
	peak           int64 // bytes: the process's peak resident memory
	took           time.Duration
}

// peakEnv makes the test binary, run with it in its environment, a
// launcher: it runs the gptui command its arguments give (itself, as
// builtGPTUI's link) and writes the command's peak resident memory, in
// KiB, to the file the variable names. Linux reports, as a process's
// ru_maxrss, the peak of the process it was started from (vfork, which
// os/exec uses, shares its memory until exec) where that is higher: a
// gptui started by the test process, which holds this test's files and
// whatever earlier tests left, would report the test's memory, not its
// own. Started by the small launcher, it reports at least the launcher's
// (some 20 MiB: the runtime and the package variables of the binary,
// which gptui holds too).
const peakEnv = "GPTUI_TEST_PEAK_FILE"

func init() {
	out := os.Getenv(peakEnv)
	if out == "" {
		return
	}
	os.Unsetenv(peakEnv)
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	if cmd.ProcessState == nil {
		fmt.Fprintln(os.Stderr, "launcher:", err)
		os.Exit(125)
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		os.WriteFile(out, []byte(strconv.FormatInt(ru.Maxrss, 10)), 0o644)
	}
	os.Exit(cmd.ProcessState.ExitCode())
}

// runMeasured runs the gptui binary (builtGPTUI) with args through the
// launcher of peakEnv, and returns its exit status, output, peak resident
// memory and how long the launcher ran.
func runMeasured(t *testing.T, args ...string) measured {
	t.Helper()
	peakFile := filepath.Join(t.TempDir(), "peak")
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(builtGPTUI(t), args...)
	cmd.Env = append(os.Environ(), "GPTUI_THREADS=1", peakEnv+"="+peakFile)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	m := measured{code: exitStatus(err), stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
	b, rerr := os.ReadFile(peakFile)
	if rerr != nil {
		if m.code == 125 || cmd.ProcessState == nil {
			t.Fatalf("gptui %s: %v\n%s", strings.Join(args, " "), err, m.stderr)
		}
		t.Skip("no rusage on this system: the peak resident memory cannot be measured")
	}
	kib, perr := strconv.ParseInt(string(b), 10, 64)
	if perr != nil {
		t.Fatal(perr)
	}
	m.peak = kib << 10 // ru_maxrss is in KiB on Linux
	return m
}

// refusedInOneLine checks that m is a refusal of bad input: exit 2 and
// one line on stderr (nothing on stdout) holding every string of want.
func refusedInOneLine(t *testing.T, m measured, want ...string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(m.stderr), "\n")
	if m.code != 2 || len(lines) != 1 || m.stdout != "" {
		t.Fatalf("exit %d, %d lines on stderr; want exit 2 and one line\nstdout:\n%s\nstderr:\n%.2000s", m.code, len(lines), m.stdout, m.stderr)
	}
	for _, w := range want {
		if !strings.Contains(lines[0], w) {
			t.Errorf("the error %q lacks %q", lines[0], w)
		}
	}
}

// mib is n bytes in MiB, for logs.
func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// sparseLLMC writes at path an llm.c model file (version 3, fp32) of shape
// s: its header, and a hole of the parameters' size (os.Truncate).
func sparseLLMC(t *testing.T, path string, s arch.Shape) int64 {
	t.Helper()
	hdr := make([]byte, 1024)
	for i, v := range []int32{20240326, 3, int32(s.MaxT), int32(s.V), int32(s.L), int32(s.NH), int32(s.C), int32(s.Vp)} {
		binary.LittleEndian.PutUint32(hdr[4*i:], uint32(v))
	}
	if err := os.WriteFile(path, hdr, 0o644); err != nil {
		t.Fatal(err)
	}
	_, n := engine.Tensors(engine.ModelConfig{Shape: s})
	size := int64(len(hdr)) + 4*int64(n)
	if err := os.Truncate(path, size); err != nil {
		t.Skipf("a sparse file of %d bytes: %v", size, err)
	}
	return size
}

// sparseLlama writes into dir a Hugging Face LlamaForCausalLM folder of
// shape s: config.json, and a model.safetensors whose header is valid
// (every tensor of s, F32) and whose data is a hole.
func sparseLlama(t *testing.T, dir string, s arch.Shape) int64 {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": %d, "hidden_size": %d, "intermediate_size": %d,
  "num_hidden_layers": %d, "num_attention_heads": %d, "num_key_value_heads": %d, "max_position_embeddings": %d, "hidden_act": "silu",
  "rms_norm_eps": 1e-05, "rope_theta": 500000, "tie_word_embeddings": false, "torch_dtype": "float32"}`, s.V, s.C, s.F, s.L, s.NH, s.NKV, s.MaxT)
	if err := os.WriteFile(filepath.Join(dir, hf.ConfigFile), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	hd := s.C / s.NH
	ts := []safetensors.Tensor{{Name: "model.embed_tokens.weight", Shape: []int{s.V, s.C}}}
	for l := range s.L {
		p := fmt.Sprintf("model.layers.%d.", l)
		ts = append(ts,
			safetensors.Tensor{Name: p + "input_layernorm.weight", Shape: []int{s.C}},
			safetensors.Tensor{Name: p + "self_attn.q_proj.weight", Shape: []int{s.NH * hd, s.C}},
			safetensors.Tensor{Name: p + "self_attn.k_proj.weight", Shape: []int{s.NKV * hd, s.C}},
			safetensors.Tensor{Name: p + "self_attn.v_proj.weight", Shape: []int{s.NKV * hd, s.C}},
			safetensors.Tensor{Name: p + "self_attn.o_proj.weight", Shape: []int{s.C, s.NH * hd}},
			safetensors.Tensor{Name: p + "post_attention_layernorm.weight", Shape: []int{s.C}},
			safetensors.Tensor{Name: p + "mlp.gate_proj.weight", Shape: []int{s.F, s.C}},
			safetensors.Tensor{Name: p + "mlp.up_proj.weight", Shape: []int{s.F, s.C}},
			safetensors.Tensor{Name: p + "mlp.down_proj.weight", Shape: []int{s.C, s.F}})
	}
	ts = append(ts, safetensors.Tensor{Name: "model.norm.weight", Shape: []int{s.C}}, safetensors.Tensor{Name: "lm_head.weight", Shape: []int{s.V, s.C}})
	path := filepath.Join(dir, hf.ModelFile)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := safetensors.NewWriter(f, ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	at, err := f.Seek(0, 1) // the header's end: the data's start
	if err != nil {
		t.Fatal(err)
	}
	var data int64
	for _, tn := range ts {
		n := int64(4)
		for _, d := range tn.Shape {
			n *= int64(d)
		}
		data += n
	}
	if err := f.Truncate(at + data); err != nil {
		t.Skipf("a sparse file of %d bytes: %v", at+data, err)
	}
	return at + data
}

// TestSparseModelFiles: model files whose headers are valid and whose
// sizes hold what the headers declare, as holes (sparse files), of
// models far larger than this process may hold — an llm.c GPT-3 175B,
// imported and as Model.init_from, and a 535 GB safetensors Llama with
// its config.json, imported — are refused in one line naming the file,
// the memory needed and the limit, exit 2, before the model is
// allocated: the process's peak resident memory stays under 100 MiB.
func TestSparseModelFiles(t *testing.T) {
	limit := planner.ProcessMemLimit()
	if limit.Bytes <= 0 {
		t.Skip("this process's memory limit is unknown here: nothing is refused for memory")
	}
	dir := t.TempDir()
	gpt3 := arch.Shape{MaxT: 2048, V: 50257, Vp: 50304, L: 96, NH: 96, C: 12288, F: 4 * 12288}
	llmc := filepath.Join(dir, "gpt3-175b.bin")
	llmcSize := sparseLLMC(t, llmc, gpt3)
	llama := arch.Shape{Family: arch.Llama, MaxT: 8192, V: 128256, Vp: 128256, L: 154, NH: 64, NKV: 8, C: 8192, F: 28672, Untied: true}
	hfDir := filepath.Join(dir, "llama-134b")
	stSize := sparseLlama(t, hfDir, llama)
	if need := 8 * min(gpt3.Params(), llama.Params()); need <= limit.Bytes {
		t.Skipf("this process may hold %s: the models fit", limit.What)
	}
	t.Logf("sparse files: %s, %.1f GB (%.1fB parameters); %s, %.1f GB (%.1fB parameters)",
		llmc, float64(llmcSize)/1e9, float64(gpt3.Params())/1e9, filepath.Join(hfDir, hf.ModelFile), float64(stSize)/1e9, float64(llama.Params())/1e9)
	out := filepath.Join(dir, "out")
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"llm.c import", []string{"import", "--from", "llmc", "--out", out, llmc}, []string{"import " + llmc, "(GPT-2 of 174.6B parameters", "TiB to import", "more than"}},
		{"llm.c init_from", []string{"train", "-c", "tiny", "-o", "Engine.log_dir=" + filepath.Join(dir, "log"), "-o", "Engine.save_load.output_dir=" + out, "-o", "Model.init_from=" + llmc},
			[]string{"Model.init_from " + llmc, "each training process", "(GPT-2 of 174.6B parameters", "GiB", "more than", "init from a smaller model file"}},
		{"hf import", []string{"import", "--from", "hf", "--out", out, hfDir}, []string{"import " + hfDir, "(Llama of 133.9B parameters", "TiB to import", "more than"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := runMeasured(t, c.args...)
			refusedInOneLine(t, m, c.want...)
			t.Logf("%s in %.2f s, peak RSS %s: %s", c.name, m.took.Seconds(), mib(m.peak), strings.TrimSpace(m.stderr))
			if m.peak >= 100<<20 {
				t.Errorf("peak RSS %s, want under 100 MiB", mib(m.peak))
			}
		})
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("%s was created: the refused imports wrote something", out)
	}
}

// hostileTokenizer writes at path a tokenizer.json of 64 MiB made to cost
// far more than its size to read: head, then item repeated (separated by
// commas), then tail.
func hostileTokenizer(t *testing.T, path, head, item, tail string) int64 {
	t.Helper()
	const size = 64 << 20
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	w.WriteString(head)
	n := (size - len(head) - len(tail) + 1) / (len(item) + 1)
	for i := range n {
		if i > 0 {
			w.WriteByte(',')
		}
		w.WriteString(item)
	}
	w.WriteString(tail)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestHostileTokenizer: a 64 MiB tokenizer.json of 33.5M one-character
// merges, of 11M well-formed ones, of 22M empty added tokens or of 2.9M
// added tokens is refused in one line naming the file, exit 2, in under
// 5 s, the process's peak resident memory at most 10× the file's size.
func TestHostileTokenizer(t *testing.T) {
	dir := t.TempDir()
	txt := filepath.Join(dir, "a.txt")
	if err := os.WriteFile(txt, []byte("some text\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	merges := `{"model":{"type":"BPE","vocab":{"a":0},"merges":[`
	for _, c := range []struct {
		name, head, item, tail, want string
	}{
		{"one-character merges", merges, "1", "]}}", `model.merges[0]: number 1 is neither "a b" nor ["a", "b"]`},
		{"empty added tokens", `{"added_tokens":[`, "{}", `],"model":null}`, "added_tokens[0].id: missing"},
		{"well-formed merges", merges, `"a b"`, "]}}", "model.merges: more than 1048576 merges"},
		{"added tokens", `{"added_tokens":[`, `{"id":1,"content":"x"}`, `],"model":null}`, "added_tokens: more than 1048576 added tokens"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".json")
			size := hostileTokenizer(t, path, c.head, c.item, c.tail)
			defer os.Remove(path)
			m := runMeasured(t, "data", "prepare", "--quiet", "--tokenizer", path, "--input", txt, "--output", filepath.Join(dir, "shards"))
			refusedInOneLine(t, m, path, c.want)
			t.Logf("%s: %s refused in %.2f s, peak RSS %s (%.1f× the file): %s", c.name, mib(size), m.took.Seconds(), mib(m.peak),
				float64(m.peak)/float64(size), strings.TrimSpace(m.stderr))
			if m.peak > 10*size {
				t.Errorf("peak RSS %s, more than 10× the file's %s", mib(m.peak), mib(size))
			}
			if m.took > 5*time.Second {
				t.Errorf("refused after %.1f s, want under 5 s", m.took.Seconds())
			}
		})
	}
}
