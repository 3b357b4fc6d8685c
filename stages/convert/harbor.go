package convert

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/harbor"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// BuildImagePrefix names the image of a task built from its
// environment/Dockerfile: the prefix and the build context's sha256, so
// tasks with one context share one image (kiln-images build makes it).
const BuildImagePrefix = "kiln.local/harbor-build:"

// defaultHarborWorkdir is the workdir of a task that names none: the
// directory Terminal-Bench and Harbor's templates work in.
const defaultHarborWorkdir = "/app"

// harborSource reads Harbor task directories (docs/data-and-grading.md §7).
type harborSource struct {
	o    *Options
	dirs []string
}

func newHarborSource(o *Options) (*harborSource, error) {
	if len(o.Dirs) == 0 {
		return nil, stagecmd.Usagef("kiln convert harbor: name at least one task directory, or a directory of tasks")
	}
	dirs, err := harbor.TaskDirs(o.Dirs)
	if err != nil {
		return nil, stagecmd.BadInputError{Err: err}
	}
	if o.Workdir != "" && !filepath.IsAbs(o.Workdir) {
		return nil, stagecmd.Usagef("--workdir %q: want an absolute path", o.Workdir)
	}
	return &harborSource{o: o, dirs: dirs}, nil
}

// Externals names every task directory by the sha256 of its whole tree
// (harbor.TarDir), so any change to any file of a task is a new version.
func (s *harborSource) Externals(ctx context.Context) ([]dataset.External, error) {
	var ext []dataset.External
	for _, d := range s.dirs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		data, sum, err := harbor.TarDir(d)
		if err != nil {
			return nil, stagecmd.BadInputError{Err: err}
		}
		abs, _ := filepath.Abs(d)
		ext = append(ext, dataset.External{Role: "harbor-task", URI: abs, SHA256: sum, Size: int64(len(data))})
	}
	return ext, nil
}

func (s *harborSource) Close() error { return nil }

func (s *harborSource) Each(ctx context.Context, fn rowFunc) error {
	for i, d := range s.dirs {
		loc := location{File: filepath.Join(d, "task.toml"), Row: int64(i + 1)}
		c, files, err := harbor.ReadTask(d)
		if err != nil {
			return stagecmd.BadInputError{Err: err}
		}
		id := harbor.TaskName(c, d)
		if err := fn(loc, id, func() (converted, error) { return s.convert(ctx, id, c, files) }); err != nil {
			return err
		}
	}
	return nil
}

// harborMeta is what the task's metadata keeps of a Harbor task: the
// whole task.toml (so nothing is lost: unknown keys included), the keys
// kiln does not map, and how its image is built.
type harborMeta struct {
	Schema   string         `json:"schema"`
	TaskTOML map[string]any `json:"task_toml"`
	Unknown  []string       `json:"unknown_keys,omitempty"`
	Build    *harborBuild   `json:"build,omitempty"`
	Compose  bool           `json:"compose,omitempty"`
}

// harborBuild is the environment/ build context of a task built from its
// Dockerfile (kiln-images build).
type harborBuild struct {
	// Context is the attachment holding environment/ (harbor.TarDir).
	Context string `json:"context"`
	// ContextSHA256 is that tar's sha256: the build's cache key.
	ContextSHA256 string `json:"context_sha256"`
	Dockerfile    string `json:"dockerfile"`
	// TimeoutSec is [environment].build_timeout_sec (0: none given).
	TimeoutSec float64 `json:"timeout_sec,omitempty"`
}

func (s *harborSource) convert(_ context.Context, id string, c *harbor.Config, f *harbor.Files) (converted, error) {
	var cv converted
	t := &cv.Task
	t.TaskID = id
	cv.Unit = id
	cv.Attachments = map[string][]byte{}
	pack := func(sub string) (string, error) {
		data, sum, err := harbor.TarDir(filepath.Join(f.Dir, sub))
		if err != nil {
			return "", stagecmd.BadInputError{Err: err}
		}
		rel := harbor.AttachmentPath(sum)
		cv.Attachments[rel] = data
		return rel, nil
	}
	g := harbor.Grading{Kind: harbor.Kind, VerifierUser: c.Verifier.User,
		VerifierEnv: c.Verifier.Env, SolutionEnv: c.Solution.Env, MemoryMB: c.MemoryBytes() >> 20}
	if c.Verifier.TimeoutSec != nil {
		g.VerifierTimeoutSec = *c.Verifier.TimeoutSec
	}
	var err error
	if g.Tests, err = pack("tests"); err != nil {
		return cv, err
	}
	if f.HasSolution {
		if g.Solution, err = pack("solution"); err != nil {
			return cv, err
		}
	}
	g.RewardMetric = s.o.RewardMetric
	if m, ok := c.Metadata["reward_metric"].(string); ok && m != "" {
		g.RewardMetric = m
	}
	meta := harborMeta{Schema: c.Schema(), TaskTOML: c.Raw, Unknown: c.Unknown}
	var image, workdir string
	switch {
	case c.Environment.DockerImage != "":
		image = c.Environment.DockerImage
	case f.Dockerfile != "":
		df, err := os.ReadFile(f.Dockerfile)
		if err != nil {
			return cv, err
		}
		rel, err := pack("environment")
		if err != nil {
			return cv, err
		}
		sum := strings.TrimSuffix(filepath.Base(rel), ".tar")
		meta.Build = &harborBuild{Context: rel, ContextSHA256: sum, Dockerfile: "Dockerfile"}
		if c.Environment.BuildTimeoutSec != nil {
			meta.Build.TimeoutSec = *c.Environment.BuildTimeoutSec
		}
		image = BuildImagePrefix + sum
		workdir = harbor.DockerfileWorkdir(string(df))
	case f.Compose != "":
		meta.Compose = true
		cv.Ungradeable = fmt.Sprintf("its environment is %s: kiln runs one container per task and does not support docker-compose environments", filepath.Base(f.Compose))
	default:
		return cv, stagecmd.BadInputf("task %q: no [environment].docker_image in task.toml and no environment/Dockerfile: kiln cannot tell which image the task runs in", f.Dir)
	}
	if f.Compose != "" && !meta.Compose && c.Environment.DockerImage == "" {
		meta.Compose = true
	}
	switch {
	case c.Environment.OS == "windows":
		cv.Ungradeable = "[environment].os is windows: kiln's sandboxes run Linux"
	case c.Environment.GPUs != nil && *c.Environment.GPUs > 0:
		cv.Ungradeable = "[environment].gpus asks for GPUs: kiln's sandboxes have none"
	}
	if pre, ok := c.Metadata["pre_commands"]; ok {
		// kiln's own key (kiln export --format harbor writes it): setup
		// commands run before the agent and before grading, a string or a
		// list of strings (docs/data-and-grading.md §4.1, §7.5).
		okList := true
		if list, isList := pre.([]any); isList {
			for _, item := range list {
				if _, isStr := item.(string); !isStr {
					okList = false
				}
			}
		} else if _, isStr := pre.(string); !isStr {
			okList = false
		}
		if !okList {
			return cv, stagecmd.BadInputf("task %q: [metadata].pre_commands: want a string or a list of strings", f.Dir)
		}
		b, _ := json.Marshal(pre)
		p := string(b)
		t.PreCommands = &p
	}
	if m, ok := c.Metadata["workdir"].(string); ok && filepath.IsAbs(m) {
		workdir = filepath.Clean(m)
	}
	if s.o.Workdir != "" {
		workdir = s.o.Workdir
	}
	if workdir == "" {
		workdir = defaultHarborWorkdir
	}
	prompt, _ := json.Marshal([]map[string]string{{"role": "user", "content": f.Instruction}})
	md, err := json.Marshal(map[string]any{"harbor": meta})
	if err != nil {
		return cv, fmt.Errorf("task %q: task.toml as JSON: %w", f.Dir, err)
	}
	user := c.Verifier.User
	if user == "" {
		user = "root"
	}
	grading := g.Marshal()
	t.Prompt = string(prompt)
	t.ProblemStatement = &f.Instruction
	t.Workdir = &workdir
	t.EvalUser = &user
	t.Grading = &grading
	t.Metadata = string(md)
	if image != "" {
		t.Image = &image
	}
	if s.o.Dataset != "" {
		ds := s.o.Dataset
		t.Dataset = &ds
	}
	return cv, t.Validate()
}

// attachmentPutter stores a task's attachments under the version's
// attachments, each once: their names are their content, so one already
// there (a resumed run, another task with the same tests) is the same file.
type attachmentPutter struct {
	put  func(ctx context.Context, rel string, data []byte) error
	done map[string]bool
}

func (a *attachmentPutter) add(ctx context.Context, atts map[string][]byte) error {
	names := make([]string, 0, len(atts))
	for n := range atts {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if a.done[n] {
			continue
		}
		if err := a.put(ctx, n, atts[n]); err != nil {
			return fmt.Errorf("storing attachment %q: %w", n, err)
		}
		a.done[n] = true
	}
	return nil
}
