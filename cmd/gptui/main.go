// Command gptui trains GPT language models: one binary for the engine, the
// data preparation, the configs, the cluster runner and its UI.
//
// Usage:
//
//	gptui [--hosts FILE | --nproc N] [--preset NAME] [-o ...]  the interactive UI
//	gptui train -c CONFIG|PRESET [-o Section.key=value ...]
//	gptui run --no-tui --nproc N -c CONFIG|PRESET [-o ...]   N local workers
//	gptui run --no-tui --hosts FILE -c CONFIG|PRESET [-o ...]  a job on the inventory's nodes over SSH
//	gptui run --detach [--nproc N | --hosts FILE] ...         either, detached from the terminal
//	gptui jobs | attach [ID] | stop ID | restart ID           the jobs started here (jobs/<id>/)
//	gptui agent [--probe]                     the node side of a cluster job (started by run)
//	gptui config -c CONFIG|PRESET [-o ...]    print the resolved config
//	gptui ranktable --hosts FILE [-o OUT] | merge A B ... -o OUT | check FILE
//	gptui presets                             list the built-in presets
//	gptui data prepare --input FILE|DIR... --output DIR
//	gptui export --ckpt DIR --to hf OUT_DIR | --to llmc FILE.bin
//	gptui import --from hf DIR | --from llmc FILE.bin --out DIR
//	gptui ckpt consolidate --ckpt DIR --out OUT_DIR
//	gptui generate --ckpt DIR --prompt TEXT [--max-new-tokens N] ...
//	gptui plan -c CONFIG|PRESET [-o ...] [--nodes N --devices-per-node D --device TYPE | --hosts FILE] [--json]
//	gptui gpu libs|check|bench|nccl           where the CUDA libraries load from; check the GPU backend against the CPU one; time the GPU's GEMMs; NCCL's data path on one rank
//	gptui report --log-dir DIR [--log-dir DIR2 ...] [--events FILE] [-o report.png]   a run's metrics drawn as one PNG
//
// Exit status: 0 on success, 2 for bad input (config, data, files), 1 for
// any other failure, and 128 + the signal's number (130, 143, 129) when
// SIGINT, SIGTERM or SIGHUP stopped it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/badinput"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/jobdir"
)

// usageError is a mistake on the command line: bad input (badinput.Err).
type usageError struct{ err error }

func (e usageError) Error() string        { return e.err.Error() }
func (e usageError) Unwrap() error        { return e.err }
func (e usageError) Is(target error) bool { return badinput.Is(target) }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func main() {
	in := notifyInterrupts()
	err := run(in.soft, os.Args[1:], os.Stdout, os.Stderr)
	in.stop()
	code := exitCode(err, os.Stderr)
	if sig := in.signal(); sig != 0 && code == 130 {
		code = interruptCode(sig)
	}
	// A worker tells its agent how it ended: the status alone cannot,
	// since the Go runtime exits 2 on its fatal errors too.
	agent.ReportExit(os.Stderr, exitRecord(err, code))
	os.Exit(code)
}

// exitRecord is what a process that exits with code for err says of its
// end (event.Exit): bad input (code 2), or a run that finished with only
// its log files failed (code 1).
func exitRecord(err error, code int) event.Exit {
	x := event.Exit{Code: code}
	if err == nil || code == 0 {
		return x
	}
	x.Error = oneLine(err)
	x.BadInput = code == 2 && errors.Is(err, badinput.Err)
	x.Finished = code == 1 && onlyLogErrors(err)
	return x
}

// exitCode prints err in one line and maps it to the exit status.
func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, context.Canceled):
		msg := "gptui: interrupted"
		var se *engine.StopError
		if errors.As(err, &se) {
			msg += " (" + se.Error() + ")"
		}
		fmt.Fprintln(stderr, msg)
		return 130
	}
	fmt.Fprintln(stderr, "gptui: "+strings.ReplaceAll(err.Error(), "\n", " "))
	if errors.Is(err, badinput.Err) {
		return 2
	}
	return 1
}

const usage = `gptui trains GPT language models.

Commands:
  (none)   [--hosts FILE | --nproc N] [--preset NAME] [-o ...]  the interactive UI (also with no arguments on a terminal)
  train    -c CONFIG|PRESET [-o Section.key=value ...]   train a model
  run      --no-tui --nproc N -c ... [-o ...]            train with N local worker processes
  run      --no-tui --hosts FILE -c ... [-o ...]         train on the inventory's nodes over SSH (--dry-run: show the plan)
  run      --detach [--nproc N | --hosts FILE] -c ...    the same job detached from this terminal: prints its id and returns
  jobs                                                   list the jobs started here (jobs/<id>/): state, step, loss, nodes, age
  attach   [ID]                                          the dashboard of a running or ended job (default: the newest)
  stop     ID                                            stop a detached job with a checkpoint
  restart  ID                                            restart a job from its newest checkpoint
  agent    [--probe]                                     the node side of a cluster job, started by run over SSH
  config   -c CONFIG|PRESET [-o ...]                     print the resolved config
  presets                                                list the built-in presets
  ranktable --hosts FILE [-o OUT] | merge A B... -o OUT | check FILE   the HCCL/MindFormers rank table
  data prepare --input FILE|DIR ... --output DIR [--tokenizer tokenizer.json]   tokenize text into shards
  export   --ckpt DIR --to hf OUT_DIR | --to llmc FILE    write a checkpoint's model for Hugging Face or llm.c
  import   --from hf DIR | --from llmc FILE --out DIR      make a checkpoint from either
  ckpt     consolidate --ckpt DIR --out OUT_DIR            rewrite a checkpoint of one file per rank as one file, for sharing
  generate --ckpt DIR --prompt TEXT [--max-new-tokens N] [--tokenizer tokenizer.json]   sample text (KV cache; --temperature 0 is greedy)
  plan     -c ... [--nodes N --devices-per-node D --device TYPE | --hosts FILE] [--top K] [--json] [--profile]
           rank the parallel strategies by predicted memory and step time
  gpu      libs | check [--only PARTS] | bench | nccl    where the CUDA libraries load from; check the GPU backend against the CPU one; time the GPU's GEMMs;
           run every NCCL operation of a multi-process GPU job on one rank
  report   --log-dir DIR [--log-dir DIR2 ...] [--events FILE] [-o report.png]   draw a run's loss, lr, step time, tokens/s, per-rank
           compute time and gradient norm as a PNG, its restarts and failures marked

Run 'gptui COMMAND -h' for a command's flags.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if wantsTUI(args) {
		return cmdTUI(ctx, args, stdout, stderr)
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usagef("no command given")
	}
	switch args[0] {
	case "train":
		return cmdTrain(ctx, args[1:], stdout, stderr)
	case "run":
		return cmdRun(ctx, args[1:], stdout, stderr)
	case "agent":
		return cmdAgent(ctx, args[1:], os.Stdin, stdout, stderr)
	case "ranktable":
		return cmdRanktable(ctx, args[1:], stdout, stderr)
	case "config":
		return cmdConfig(args[1:], stdout, stderr)
	case "presets":
		return cmdPresets(stdout)
	case "data":
		return cmdData(ctx, args[1:], stdout, stderr)
	case "export":
		return cmdExport(args[1:], stdout, stderr)
	case "import":
		return cmdImport(args[1:], stdout, stderr)
	case "ckpt":
		return cmdCkpt(args[1:], stdout, stderr)
	case "plan":
		return cmdPlan(ctx, args[1:], stdout, stderr)
	case planLinkPeer: // hidden: an end of the links 'plan --profile' measures
		return cmdPlanLinkPeer(ctx, stdout)
	case "generate":
		return cmdGenerate(ctx, args[1:], stdout, stderr)
	case "gpu":
		return cmdGPU(ctx, args[1:], stdout, stderr)
	case "report":
		return cmdReport(args[1:], stdout, stderr)
	case "jobs":
		return cmdJobs(args[1:], stdout, stderr)
	case "attach":
		return cmdAttach(ctx, args[1:], stdout, stderr)
	case "stop":
		return cmdStop(ctx, args[1:], stdout, stderr)
	case "restart":
		return cmdRestart(args[1:], stdout, stderr)
	case jobdir.SuperviseCommand: // hidden: a detached job's supervisor
		return cmdSupervise(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	return usagef("unknown command %q; run 'gptui help'", args[0])
}

// listFlag collects a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("gptui "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parse parses flags, turning flag errors into usage errors; a command
// that takes no positional arguments refuses any.
func parse(fs *flag.FlagSet, args []string) error {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("%s: unexpected argument %q", fs.Name(), pos[0])
	}
	return nil
}

// parseArgs parses flags that may come before, between and after the
// positional arguments, and returns those arguments in order. Everything
// after "--" is positional. Flag errors are usage errors.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageError{err}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}
