package shellagent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Manual is kiln-agent's --help.
const Manual = `kiln-agent: kiln's shell agent, a minimal coding-agent loop.

Usage:
  kiln-agent --base-url URL --model NAME --task-file FILE [flags]

It asks a model through an OpenAI Chat Completions endpoint (kiln's adapter,
so every turn is recorded there like any other client's), offers it two
tools, runs the calls it makes in order and sends the results back, re-sending
the whole history each turn, until the model answers without a tool call.

Flags:
  --base-url URL            the API base, ending in /v1; requests go to
                            URL/chat/completions (env KILN_AGENT_BASE_URL,
                            then OPENAI_BASE_URL): http:// or https://
  --model NAME              the model field of each request
  --task-file FILE          the problem statement (the user message)
  --workdir DIR             where commands run and relative paths resolve
                            (default: the current directory)
  --max-turns N             model calls at most (default 50)
  --timeout DURATION        the whole run (default 20m)
  --command-timeout DURATION
                            each bash call; the command's process group is
                            killed when it runs past it, and the loop goes on
                            (default 2m)
  --max-output-bytes N      each tool result's output at most, its head and
                            tail kept with a note of what was cut
                            (default 16384)
  --log FILE                write a JSONL transcript, one object per event
                            (start, assistant, tool, model_error, end); its
                            directory is made if missing
  --temperature F           sent as temperature (default: not sent)
  --max-tokens N            sent as max_tokens (default: not sent)
  --help                    this manual

Environment:
  KILN_AGENT_API_KEY, else OPENAI_API_KEY   sent as Authorization: Bearer
                            (kiln's adapter reads it as the session id)
  KILN_AGENT_SESSION        when set, sent as the x-session-id header and as
                            the body's metadata.session_id (the adapter's
                            session when no API key is set)
  KILN_AGENT_PROXY          when set, the HTTP proxy URL of every model call;
                            HTTP_PROXY, HTTPS_PROXY and NO_PROXY are ignored
                            (they are the image's, passed on to commands)
  SSL_CERT_FILE, SSL_CERT_DIR
                            the CA certificates for https:// (default: the
                            system's, e.g. /etc/ssl/certs)

Tools offered to the model:
  bash {command}            /bin/sh -c COMMAND in the workdir (the image may
                            have no bash), stdin /dev/null, stdout and stderr
                            combined, the exit code reported; the environment
                            is kiln-agent's less its KILN_AGENT_* variables
  edit {path, old_str, new_str}
                            replace the one occurrence of old_str with
                            new_str; with an empty old_str, create the file
                            (it must not exist)
A call of another tool, or with arguments that are not a JSON object, gets
an error result; a tool's failure never ends the run.

Output: the final answer on stdout; errors on stderr.

Exit status:
  0  the model gave a final answer (a reply without tool calls, even one
     cut at the token limit)
  1  a model call failed: a 4xx (or 3xx: redirects are not followed) reply,
     or a 5xx reply or connection error still failing after 2 retries (1 s,
     then 2 s apart), or a bad reply
  2  bad usage (flags, task file, workdir, log file)
  3  --max-turns model calls made without a final answer
  4  the --timeout ran out
A SIGTERM or SIGINT kills the running command and exits 1.

Build: kiln-agent must be a static binary to run in any image: build it
with CGO_ENABLED=0 (pure-Go DNS resolver, no libc), as make build does:
  CGO_ENABLED=0 go build -o bin/ ./cmd/kiln-agent
Bind-mount it like kiln-sandbox-helper (kiln-rollout run's shell harness
binds it at /run/kiln/bin/kiln-agent); make build puts it in bin/ beside
the other binaries.
`

// Main is kiln-agent: it parses args (getenv gives the environment
// fallbacks), runs the loop and returns the exit status.
func Main(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kiln-agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var (
		cfg      Config
		taskFile string
		logFile  string
		help     bool
	)
	fs.StringVar(&cfg.BaseURL, "base-url", "", "")
	fs.StringVar(&cfg.Model, "model", "", "")
	fs.StringVar(&taskFile, "task-file", "", "")
	fs.StringVar(&cfg.Workdir, "workdir", "", "")
	fs.IntVar(&cfg.MaxTurns, "max-turns", DefaultMaxTurns, "")
	fs.DurationVar(&cfg.Timeout, "timeout", DefaultTimeout, "")
	fs.DurationVar(&cfg.CommandTimeout, "command-timeout", DefaultCommandTimeout, "")
	fs.IntVar(&cfg.MaxOutputBytes, "max-output-bytes", DefaultMaxOutputBytes, "")
	fs.StringVar(&logFile, "log", "", "")
	fs.Func("temperature", "", func(s string) error {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return err
		}
		cfg.Temperature = &f
		return nil
	})
	fs.IntVar(&cfg.MaxTokens, "max-tokens", 0, "")
	fs.BoolVar(&help, "help", false, "")
	fs.BoolVar(&help, "h", false, "")

	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "kiln-agent: "+format+"\n(kiln-agent --help for the manual)\n", a...)
		return ExitUsage
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, Manual)
			return 0
		}
		return usage("%v", err)
	}
	if help {
		fmt.Fprint(stdout, Manual)
		return 0
	}
	if fs.NArg() > 0 {
		return usage("unexpected arguments %q", fs.Args())
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = firstEnv(getenv, "KILN_AGENT_BASE_URL", "OPENAI_BASE_URL")
	}
	cfg.APIKey = firstEnv(getenv, "KILN_AGENT_API_KEY", "OPENAI_API_KEY")
	cfg.Session = getenv("KILN_AGENT_SESSION")
	if p := getenv("KILN_AGENT_PROXY"); p != "" {
		u, err := url.Parse(p)
		if err != nil || u.Host == "" {
			return usage("KILN_AGENT_PROXY %q: not a proxy URL (http://HOST:PORT)", p)
		}
		cfg.Proxy = u
	}
	switch {
	case cfg.BaseURL == "":
		return usage("--base-url is required (or KILN_AGENT_BASE_URL / OPENAI_BASE_URL)")
	case !strings.HasPrefix(cfg.BaseURL, "http://") && !strings.HasPrefix(cfg.BaseURL, "https://"):
		return usage("--base-url %q: only http:// and https:// URLs are supported", cfg.BaseURL)
	case cfg.Model == "":
		return usage("--model is required")
	case taskFile == "":
		return usage("--task-file is required")
	case cfg.MaxTurns < 1:
		return usage("--max-turns %d: must be at least 1", cfg.MaxTurns)
	case cfg.Timeout <= 0:
		return usage("--timeout %s: must be positive", cfg.Timeout)
	case cfg.CommandTimeout <= 0:
		return usage("--command-timeout %s: must be positive", cfg.CommandTimeout)
	case cfg.MaxOutputBytes < 64:
		return usage("--max-output-bytes %d: must be at least 64", cfg.MaxOutputBytes)
	case cfg.MaxTokens < 0:
		return usage("--max-tokens %d: must not be negative", cfg.MaxTokens)
	}
	task, err := os.ReadFile(taskFile)
	if err != nil {
		return usage("task file: %v", err)
	}
	if strings.TrimSpace(string(task)) == "" {
		return usage("task file %s is empty", taskFile)
	}
	cfg.Task = string(task)
	if cfg.Workdir == "" {
		if cfg.Workdir, err = os.Getwd(); err != nil {
			return usage("workdir: %v", err)
		}
	}
	if cfg.Workdir, err = filepath.Abs(cfg.Workdir); err != nil {
		return usage("workdir %s: %v", cfg.Workdir, err)
	}
	if st, err := os.Stat(cfg.Workdir); err != nil {
		return usage("workdir: %v", err)
	} else if !st.IsDir() {
		return usage("workdir %s: not a directory", cfg.Workdir)
	}
	if logFile != "" {
		// The log's directory is made if missing (the harness puts the log
		// under WORKDIR/.harness/).
		if err := os.MkdirAll(filepath.Dir(logFile), 0o755); err != nil {
			return usage("log: %v", err)
		}
		f, err := os.OpenFile(logFile, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
		if err != nil {
			return usage("log: %v", err)
		}
		defer f.Close()
		cfg.Log = f
	}

	// SIGTERM or SIGINT ends the run as an interruption (exit 1), killing
	// the running command's process group, which a signal to kiln-agent
	// alone would leave behind (each command has its own group).
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	res := Run(ctx, cfg)
	switch res.ExitCode {
	case ExitFinal:
		fmt.Fprintln(stdout, res.Final)
	case ExitMaxTurns:
		fmt.Fprintf(stderr, "kiln-agent: no final answer after %d turns (--max-turns)\n", res.Turns)
	default:
		fmt.Fprintf(stderr, "kiln-agent: %v\n", res.Err)
	}
	return res.ExitCode
}

func firstEnv(getenv func(string) string, names ...string) string {
	for _, n := range names {
		if v := getenv(n); v != "" {
			return v
		}
	}
	return ""
}
