// Package harbor reads and writes Harbor task directories (task.toml,
// instruction.md, environment/, tests/, solution/) for kiln-convert,
// kiln-images build, kiln-grade and kiln export. The mapping of every
// task.toml key onto kiln's task fields is docs/data-and-grading.md §7.
package harbor

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// Config is a task.toml, in either schema form: `version = "1.0"` with a
// free-form [metadata] table, or `schema_version = "1.1"` (and later 1.x)
// with a [task] table. Fields are the keys kiln maps; every other key is
// kept by Parse in Raw and listed in Unknown.
type Config struct {
	Version       string         `toml:"version"`
	SchemaVersion string         `toml:"schema_version"`
	Task          *TaskInfo      `toml:"task"`
	Metadata      map[string]any `toml:"metadata"`
	Verifier      Verifier       `toml:"verifier"`
	Agent         Agent          `toml:"agent"`
	Solution      Solution       `toml:"solution"`
	Environment   Environment    `toml:"environment"`
	Source        string         `toml:"source"`

	// Raw is the whole document (every key, known or not).
	Raw map[string]any `toml:"-"`
	// Unknown are the dotted keys kiln does not map, in document order;
	// they stay in Raw, which the task's metadata carries.
	Unknown []string `toml:"-"`
}

// TaskInfo is schema 1.1's [task] table.
type TaskInfo struct {
	Name        string   `toml:"name"`
	Description string   `toml:"description"`
	Authors     []Author `toml:"authors"`
	Keywords    []string `toml:"keywords"`
}

// Author is one [task].authors entry.
type Author struct {
	Name  string `toml:"name"`
	Email string `toml:"email"`
}

// Verifier is [verifier]: how tests/test.sh runs.
type Verifier struct {
	TimeoutSec *float64          `toml:"timeout_sec"`
	Env        map[string]string `toml:"env"`
	User       string            `toml:"user"`
}

// Agent is [agent].
type Agent struct {
	TimeoutSec      *float64 `toml:"timeout_sec"`
	SetupTimeoutSec *float64 `toml:"setup_timeout_sec"`
	User            string   `toml:"user"`
}

// Solution is [solution]: the oracle's environment.
type Solution struct {
	Env map[string]string `toml:"env"`
}

// Environment is [environment]: the image and the sandbox's resources.
// memory and storage are the older string spellings ("4G") of memory_mb
// and storage_mb.
type Environment struct {
	BuildTimeoutSec *float64          `toml:"build_timeout_sec"`
	DockerImage     string            `toml:"docker_image"`
	OS              string            `toml:"os"`
	CPUs            *float64          `toml:"cpus"`
	MemoryMB        *int64            `toml:"memory_mb"`
	StorageMB       *int64            `toml:"storage_mb"`
	Memory          string            `toml:"memory"`
	Storage         string            `toml:"storage"`
	GPUs            *int64            `toml:"gpus"`
	GPUTypes        []string          `toml:"gpu_types"`
	AllowInternet   *bool             `toml:"allow_internet"`
	Env             map[string]string `toml:"env"`
}

// Error is a malformed task.toml: the file, the 1-based line (0 when
// unknown), the dotted key, and what is wrong.
type Error struct {
	File string
	Line int
	Key  string
	Msg  string
}

func (e *Error) Error() string {
	loc := fmt.Sprintf("%q", e.File)
	if e.Line > 0 {
		loc += fmt.Sprintf(" line %d", e.Line)
	}
	if e.Key != "" {
		loc += fmt.Sprintf(" key %q", e.Key)
	}
	return loc + ": " + e.Msg
}

// Schema is the task.toml's schema version: "1.0" for the version form
// (also when neither key is given, Harbor's default), else schema_version.
func (c *Config) Schema() string {
	if c.SchemaVersion != "" {
		return c.SchemaVersion
	}
	if c.Version != "" {
		return c.Version
	}
	return "1.0"
}

// MemoryBytes is the memory limit the task asks for (memory_mb, else
// memory), 0 when it names none.
func (c *Config) MemoryBytes() int64 {
	if c.Environment.MemoryMB != nil {
		return *c.Environment.MemoryMB << 20
	}
	n, _ := parseSize(c.Environment.Memory)
	return n
}

// StorageBytes is storage_mb (else storage) in bytes, 0 when unset.
func (c *Config) StorageBytes() int64 {
	if c.Environment.StorageMB != nil {
		return *c.Environment.StorageMB << 20
	}
	n, _ := parseSize(c.Environment.Storage)
	return n
}

// known are the keys Config maps, as dotted paths; a table listed here
// takes every key below it (the free-form ones: metadata and env tables).
var known = map[string]bool{
	"version": true, "schema_version": true, "source": true,
	"task": true, "task.name": true, "task.description": true, "task.authors": true,
	"task.authors.name": true, "task.authors.email": true, "task.keywords": true,
	"metadata": true,
	"verifier": true, "verifier.timeout_sec": true, "verifier.env": true, "verifier.user": true,
	"agent": true, "agent.timeout_sec": true, "agent.setup_timeout_sec": true, "agent.user": true,
	"solution": true, "solution.env": true,
	"environment": true, "environment.build_timeout_sec": true, "environment.docker_image": true,
	"environment.os": true, "environment.cpus": true, "environment.memory_mb": true,
	"environment.storage_mb": true, "environment.memory": true, "environment.storage": true,
	"environment.gpus": true, "environment.gpu_types": true, "environment.allow_internet": true,
	"environment.env": true,
}

// freeForm are the tables whose keys are the task author's own.
var freeForm = []string{"metadata.", "verifier.env.", "solution.env.", "environment.env."}

var userName = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// ParseFile reads and checks the task.toml at path.
func ParseFile(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse decodes and checks a task.toml; name is the file named in errors.
// Syntax errors, values of the wrong type and values out of range are an
// *Error naming the file, line and key.
func Parse(name string, data []byte) (*Config, error) {
	src := string(data)
	var c Config
	md, err := toml.Decode(src, &c)
	if err != nil {
		return nil, decodeError(name, src, err)
	}
	if _, err := toml.Decode(src, &c.Raw); err != nil {
		return nil, decodeError(name, src, err)
	}
	for _, k := range md.Undecoded() {
		ks := k.String()
		if known[ks] || hasAnyPrefix(ks, freeForm) || md.Type(k...) == "Hash" {
			continue // a table's own keys are listed, not the table
		}
		c.Unknown = append(c.Unknown, ks)
	}
	bad := func(key, format string, args ...any) error {
		return &Error{File: name, Line: keyLine(src, key), Key: key, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.SchemaVersion != "" && !strings.HasPrefix(c.SchemaVersion, "1."):
		return nil, bad("schema_version", "schema version %q is not one kiln reads (want 1.x)", c.SchemaVersion)
	case c.SchemaVersion == "" && c.Version != "" && !strings.HasPrefix(c.Version, "1."):
		return nil, bad("version", "version %q is not one kiln reads (want 1.0)", c.Version)
	}
	positive := func(key string, v *float64) error {
		if v != nil && !(*v > 0 && !math.IsInf(*v, 0)) {
			return bad(key, "%v: want a positive number of seconds", *v)
		}
		return nil
	}
	for key, v := range map[string]*float64{"verifier.timeout_sec": c.Verifier.TimeoutSec,
		"agent.timeout_sec": c.Agent.TimeoutSec, "agent.setup_timeout_sec": c.Agent.SetupTimeoutSec,
		"environment.build_timeout_sec": c.Environment.BuildTimeoutSec} {
		if err := positive(key, v); err != nil {
			return nil, err
		}
	}
	e := &c.Environment
	switch {
	case e.CPUs != nil && !(*e.CPUs > 0 && *e.CPUs < 1<<20):
		return nil, bad("environment.cpus", "%v: want a positive number of CPUs", *e.CPUs)
	case e.MemoryMB != nil && (*e.MemoryMB <= 0 || *e.MemoryMB > 1<<30):
		return nil, bad("environment.memory_mb", "%d: want a positive number of MB", *e.MemoryMB)
	case e.StorageMB != nil && (*e.StorageMB <= 0 || *e.StorageMB > 1<<40):
		return nil, bad("environment.storage_mb", "%d: want a positive number of MB", *e.StorageMB)
	case e.GPUs != nil && *e.GPUs < 0:
		return nil, bad("environment.gpus", "%d: want 0 or more", *e.GPUs)
	case e.OS != "" && e.OS != "linux" && e.OS != "windows":
		return nil, bad("environment.os", "%q: want linux or windows", e.OS)
	case c.Verifier.User != "" && !userName.MatchString(c.Verifier.User):
		return nil, bad("verifier.user", "%q is not a user name", c.Verifier.User)
	case c.Agent.User != "" && !userName.MatchString(c.Agent.User):
		return nil, bad("agent.user", "%q is not a user name", c.Agent.User)
	}
	for key, s := range map[string]string{"environment.memory": e.Memory, "environment.storage": e.Storage} {
		if _, err := parseSize(s); err != nil {
			return nil, bad(key, "%v", err)
		}
	}
	if c.Task != nil && c.Task.Name != "" && !validName(c.Task.Name) {
		return nil, bad("task.name", "%q: want a name of letters, digits, '.', '_', '-' and at most one '/' (org/name)", c.Task.Name)
	}
	return &c, nil
}

// validName accepts Harbor's task names: NAME or ORG/NAME.
func validName(s string) bool {
	parts := strings.Split(s, "/")
	if len(parts) > 2 {
		return false
	}
	for _, p := range parts {
		if p == "" || p == "." || p == ".." || len(p) > 128 {
			return false
		}
		for _, r := range p {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
				return false
			}
		}
	}
	return true
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

var decodeLine = regexp.MustCompile(`line (\d+) \(last key "([^"]*)"\)`)

// decodeError turns the TOML library's error into an *Error with the
// file, line and key it names.
func decodeError(name, src string, err error) error {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		line := pe.Position.Line
		if line == 0 && pe.LastKey != "" {
			line = keyLine(src, pe.LastKey)
		}
		return &Error{File: name, Line: line, Key: pe.LastKey, Msg: pe.Message}
	}
	msg := strings.TrimPrefix(err.Error(), "toml: ")
	if m := decodeLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		rest := strings.TrimSpace(strings.Replace(msg, m[0], "", 1))
		return &Error{File: name, Line: line, Key: m[2], Msg: strings.TrimSpace(strings.TrimPrefix(rest, ":"))}
	}
	return &Error{File: name, Msg: msg}
}

// keyLine finds the line of a dotted key: "table.key" as `key = ...` under
// `[table]`, or written dotted or inline; 0 when it is not found.
func keyLine(src, dotted string) int {
	table, key := "", dotted
	if i := strings.LastIndexByte(dotted, '.'); i >= 0 {
		table, key = dotted[:i], dotted[i+1:]
	}
	cur := ""
	assign := regexp.MustCompile(`^\s*"?` + regexp.QuoteMeta(key) + `"?\s*=`)
	full := regexp.MustCompile(`^\s*` + regexp.QuoteMeta(dotted) + `\s*=`)
	for i, line := range strings.Split(src, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "[") {
			name := strings.Trim(strings.SplitN(t, "]", 2)[0], "[] ")
			cur = name
			if name == dotted {
				return i + 1
			}
			continue
		}
		if cur == table && assign.MatchString(line) {
			return i + 1
		}
		if cur == "" && full.MatchString(line) {
			return i + 1
		}
		if table != "" && cur == "" && strings.Contains(line, table+" ") && strings.Contains(line, key) {
			return i + 1 // an inline table: table = { key = ... }
		}
	}
	return 0
}

// parseSize reads Harbor's memory and storage strings: a number of bytes,
// or a number with a unit K, M, G or T (optionally followed by B or iB,
// powers of 1024 either way). "" is 0.
func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	num := strings.TrimRightFunc(s, func(r rune) bool { return r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' })
	unit := strings.ToUpper(strings.TrimSpace(s[len(num):]))
	unit = strings.TrimSuffix(strings.TrimSuffix(unit, "B"), "I")
	mult := map[string]float64{"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit]
	f, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if mult == 0 || err != nil || !(f > 0) || f*mult > 1<<50 {
		return 0, fmt.Errorf("%q: want a size such as 4G, 512M or 2048M", s)
	}
	return int64(f * mult), nil
}

// Files is what a task directory holds besides task.toml.
type Files struct {
	Dir         string // the task directory
	Instruction string // instruction.md
	Dockerfile  string // environment/Dockerfile, "" when absent
	Compose     string // environment/docker-compose.yaml (or .yml), "" when absent
	HasSolution bool   // solution/solve.sh exists
}

// ReadTask reads a task directory: task.toml (checked), instruction.md
// (required) and tests/test.sh (required); environment/ and solution/ are
// looked at, not read.
func ReadTask(dir string) (*Config, *Files, error) {
	c, err := ParseFile(filepath.Join(dir, "task.toml"))
	if err != nil {
		return nil, nil, err
	}
	f := &Files{Dir: dir}
	ins, err := os.ReadFile(filepath.Join(dir, "instruction.md"))
	if err != nil {
		return nil, nil, fmt.Errorf("task %q: reading instruction.md (every Harbor task has one): %w", dir, err)
	}
	f.Instruction = string(ins)
	if fi, err := os.Stat(filepath.Join(dir, "tests", "test.sh")); err != nil || !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("task %q: tests/test.sh is missing or not a file: it is the verifier every Harbor task has", dir)
	}
	for _, n := range []string{"docker-compose.yaml", "docker-compose.yml"} {
		if _, err := os.Stat(filepath.Join(dir, "environment", n)); err == nil {
			f.Compose = filepath.Join(dir, "environment", n)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "environment", "Dockerfile")); err == nil {
		f.Dockerfile = filepath.Join(dir, "environment", "Dockerfile")
	}
	if fi, err := os.Stat(filepath.Join(dir, "solution", "solve.sh")); err == nil && fi.Mode().IsRegular() {
		f.HasSolution = true
	}
	return c, f, nil
}

// TaskDirs expands the arguments of `kiln convert harbor`: a directory
// holding task.toml is one task; any other directory is a dataset whose
// subdirectories holding task.toml are its tasks, in name order. A
// dataset without tasks, or an argument that is not a directory, is an
// error.
func TaskDirs(args []string) ([]string, error) {
	var out []string
	for _, a := range args {
		fi, err := os.Stat(a)
		if err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("%q is not a directory: want a Harbor task directory (with task.toml) or a directory of them", a)
		}
		if _, err := os.Stat(filepath.Join(a, "task.toml")); err == nil {
			out = append(out, filepath.Clean(a))
			continue
		}
		ents, err := os.ReadDir(a)
		if err != nil {
			return nil, err
		}
		var found []string
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			if _, err := os.Stat(filepath.Join(a, e.Name(), "task.toml")); err == nil {
				found = append(found, filepath.Join(a, e.Name()))
			}
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("%q holds no Harbor task: neither it nor any directory in it has a task.toml", a)
		}
		sort.Strings(found)
		out = append(out, found...)
	}
	return out, nil
}

// TaskName is the task's name: [task].name (schema 1.1), else the
// directory's name.
func TaskName(c *Config, dir string) string {
	if c.Task != nil && c.Task.Name != "" {
		return c.Task.Name
	}
	return filepath.Base(filepath.Clean(dir))
}

// DockerfileWorkdir is the last absolute WORKDIR of a Dockerfile, "" when
// it sets none (a relative one, or one with a variable, is not followed).
func DockerfileWorkdir(dockerfile string) string {
	wd := ""
	for _, line := range strings.Split(dockerfile, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && strings.EqualFold(f[0], "WORKDIR") && strings.HasPrefix(f[1], "/") && !strings.Contains(f[1], "$") {
			wd = filepath.Clean(f[1])
		}
	}
	return wd
}
