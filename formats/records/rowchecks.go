package records

import (
	"fmt"
	"math"
	"reflect"
	"strings"
)

// Abort reasons of a rollouts row (docs/records.md §4, docs/rollout.md
// §2.4): the list kiln-rollout writes from, and the one Rollout.Validate
// holds every row to, written or imported.
const (
	AbortMissingImage   = "missing_image_or_workdir"
	AbortSessionEmpty   = "adapter_session_empty"
	AbortDeadline       = "wall_clock_timeout"
	AbortEngineError    = "engine_error"
	AbortAgentCrash     = "agent_crash"
	AbortReplayMismatch = "replay_mismatch"
	AbortWeightsChanged = "weights_changed"
	// AbortEndpointFlood: the agent held more connections to its model
	// endpoint at once than its share of the stage's descriptors.
	AbortEndpointFlood = "endpoint_flood"
	// AbortExceptionPrefix and AbortUnevaluatablePrefix start the reasons
	// "exception:<type>" (kiln-rollout: what failed, e.g.
	// exception:sandbox_boot) and "unevaluatable:<why>" (the reference
	// stack's); the rest is letters, digits, '_', '.' and '-'.
	AbortExceptionPrefix     = "exception:"
	AbortUnevaluatablePrefix = "unevaluatable:"
)

var abortReasons = map[string]bool{AbortMissingImage: true, AbortSessionEmpty: true, AbortDeadline: true,
	AbortEngineError: true, AbortAgentCrash: true, AbortReplayMismatch: true, AbortWeightsChanged: true, AbortEndpointFlood: true}

// CheckAbortReason accepts the reasons a rollouts row may carry.
func CheckAbortReason(reason string) error {
	if abortReasons[reason] {
		return nil
	}
	for _, p := range []string{AbortExceptionPrefix, AbortUnevaluatablePrefix} {
		if rest, ok := strings.CutPrefix(reason, p); ok && rest != "" && strings.Trim(rest, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == "" {
			return nil
		}
	}
	return fmt.Errorf("unknown abort_reason %q (want one of %s, %s<type> or %s<why>)", reason,
		strings.Join([]string{AbortMissingImage, AbortSessionEmpty, AbortDeadline, AbortEngineError, AbortAgentCrash,
			AbortReplayMismatch, AbortWeightsChanged, AbortEndpointFlood}, ", "), AbortExceptionPrefix, AbortUnevaluatablePrefix)
}

// checkIDs accepts the ids every row of a run carries (docs/records.md
// §1): rollout_id, index and group_index are ordinals, never negative.
func checkIDs(rolloutID, index, groupIndex int64) error {
	if rolloutID < 0 || index < 0 || groupIndex < 0 {
		return fmt.Errorf("negative id (rollout_id %d, index %d, group_index %d): ids are ordinals, 0 or more", rolloutID, index, groupIndex)
	}
	return nil
}

// checkStoreKey accepts what a row names as a stored file (a grade's log,
// a run's artifacts): a store key, relative, slash-separated, without
// empty, "." or ".." segments, NUL or backslash, so no reader resolving it
// under a directory leaves that directory. dir allows one trailing slash
// (a prefix naming a directory of files).
func checkStoreKey(what, key string, dir bool) error {
	k := key
	if dir {
		k = strings.TrimSuffix(k, "/")
	}
	if k == "" || strings.HasPrefix(k, "/") || strings.ContainsAny(k, "\\\x00") {
		return fmt.Errorf("%s %q: want a relative slash-separated store key, without NUL or backslash", what, key)
	}
	for _, seg := range strings.Split(k, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("%s %q: empty, \".\" or \"..\" path segment", what, key)
		}
	}
	return nil
}

// checkTokenIDs accepts token ids: vocabulary indices, 0 or more.
func checkTokenIDs(what string, ids []int32) error {
	for i, id := range ids {
		if id < 0 {
			return fmt.Errorf("%s[%d] = %d: token ids are 0 or more", what, i, id)
		}
	}
	return nil
}

// checkLogProbs accepts log probabilities: finite and at most 0.
func checkLogProbs(what string, lps []float32) error {
	for i, lp := range lps {
		// NaN fails lp <= 0; -Inf is the only value below -MaxFloat32.
		if !(lp <= 0) || lp < -math.MaxFloat32 {
			return fmt.Errorf("%s[%d] = %v: a logprob is finite and at most 0", what, i, lp)
		}
	}
	return nil
}

// finite reports whether f is a number (not NaN or ±Inf).
func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// parquetColumns lists a Parquet row type's columns as its JSON view
// names them: required (not ",optional") and nullable.
func parquetColumns(v any) (required []string, nullable map[string]bool) {
	nullable = map[string]bool{}
	t := reflect.TypeOf(v)
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		if strings.Contains(f.Tag.Get("parquet"), ",optional") {
			nullable[name] = true
		} else {
			required = append(required, name)
		}
	}
	return required, nullable
}

// checkFields holds a JSON row to its kind's columns before it is
// decoded, which would take a missing key or a null for the zero value
// (a "reward": null for reward 0): every required key is present and no
// key outside nullable is null. It names the first key that fails.
func checkFields(line []byte, required []string, nullable map[string]bool) error {
	o, err := parseObject(line)
	if err != nil {
		return err
	}
	for _, m := range o {
		if string(m.Val) == "null" && !nullable[m.Key] {
			return fmt.Errorf("field %q is null: it needs a value", m.Key)
		}
	}
	for _, k := range required {
		if _, ok := o.get(k); !ok {
			return fmt.Errorf("field %q is missing: every row has it", k)
		}
	}
	return nil
}
