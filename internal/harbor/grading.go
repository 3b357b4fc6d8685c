package harbor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Kind is the grading kind of a converted Harbor task.
const Kind = "harbor"

// Grading is the tasks grading column of a Harbor task (kind "harbor"):
// where its tests and oracle are among the version's attachments, and how
// the verifier runs (docs/data-and-grading.md §7).
type Grading struct {
	Kind string `json:"kind"`
	// Tests is the attachment (AttachmentPath) holding tests/, packed by
	// TarDir; uploaded to /tests only after the patch is applied.
	Tests string `json:"tests"`
	// Solution is the attachment holding solution/ ("" without one).
	Solution string `json:"solution,omitempty"`
	// VerifierTimeoutSec bounds tests/test.sh (0: kiln-grade's --timeout).
	VerifierTimeoutSec float64 `json:"verifier_timeout_sec,omitempty"`
	// VerifierUser runs tests/test.sh ("" = root, as Harbor's default).
	VerifierUser string            `json:"verifier_user,omitempty"`
	VerifierEnv  map[string]string `json:"verifier_env,omitempty"`
	SolutionEnv  map[string]string `json:"solution_env,omitempty"`
	// RewardMetric names the reward.json metric that is the reward
	// ("" = "reward").
	RewardMetric string `json:"reward_metric,omitempty"`
	// MemoryMB is the grading sandbox's memory limit (0: the default).
	MemoryMB int64 `json:"memory_mb,omitempty"`
}

// Marshal is the grading column's JSON.
func (g *Grading) Marshal() string {
	b, _ := json.Marshal(g)
	return string(b)
}

// Where the verifier writes its reward inside the sandbox.
const (
	LogsDir    = "/logs/verifier"
	RewardTXT  = LogsDir + "/reward.txt"
	RewardJSON = LogsDir + "/reward.json"
	TestsDir   = "/tests"
	SolveDir   = "/solution"
)

// RewardFromJSON reads reward.json: an object of named numeric metrics.
// The reward is the metric named metric (when given), else "reward", else
// the only metric when there is exactly one. It must be a finite number in
// [0, 1].
func RewardFromJSON(data []byte, metric string) (float64, error) {
	var m map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&m); err != nil || m == nil {
		return 0, fmt.Errorf("reward.json is not a JSON object of metrics: %v", err)
	}
	name := metric
	if name == "" {
		name = "reward"
		if _, ok := m[name]; !ok && len(m) == 1 {
			for k := range m {
				name = k
			}
		}
	}
	raw, ok := m[name]
	if !ok {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return 0, fmt.Errorf("reward.json has no metric %q (it has %s): declare the metric with [metadata] reward_metric or --reward-metric", name, strings.Join(keys, ", "))
	}
	var v float64
	if err := json.Unmarshal(raw, &v); err != nil {
		var b bool
		if json.Unmarshal(raw, &b) != nil {
			return 0, fmt.Errorf("reward.json metric %q is %s, not a number", name, raw)
		}
		v = map[bool]float64{false: 0, true: 1}[b]
	}
	return checkReward(v, "reward.json metric "+strconv.Quote(name))
}

// RewardFromText reads reward.txt: one number.
func RewardFromText(data []byte) (float64, error) {
	s := strings.TrimSpace(string(data))
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("reward.txt holds %q, not a number", truncate(s, 80))
	}
	return checkReward(v, "reward.txt")
}

func checkReward(v float64, what string) (float64, error) {
	if math.IsNaN(v) || v < 0 || v > 1 {
		return 0, fmt.Errorf("%s is %v: kiln's rewards are in [0, 1]", what, v)
	}
	return v, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
