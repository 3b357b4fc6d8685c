package enginectl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kilnrl/kiln/internal/enginectl"
	"github.com/kilnrl/kiln/internal/testenv/gputest"
)

// Reload against kiln's real policy server (docs/serve.md §6 speaks the
// vLLM protocol of docs/sync.md §3): the tiny checkpoint reloaded from its
// own directory as weights 5, then the server reports 5 and every token
// it generates is from weights 5. Without gpu/'s environment the test
// skips (fails under CI=true); -short skips it.
func TestReloadServePy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Python model server")
	}
	ge := gputest.Find(t)
	ckpt := ge.Tiny(t)
	base := ge.Serve(t, ckpt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	o := enginectl.Options{Protocol: enginectl.VLLM, CallTimeout: time.Minute}

	if v, err := enginectl.ServedVersion(ctx, base, o); err != nil || v != "0" {
		t.Fatalf("ServedVersion before the reload = %q, %v; want 0", v, err)
	}
	// Twice: a rerun on a fleet already at 5 reloads again and resumes;
	// the second with --flush, which serve.py answers as vLLM does.
	for run := 1; run <= 2; run++ {
		o.Flush = run == 2
		if err := enginectl.Reload(ctx, []string{base}, ckpt, 5, o); err != nil {
			t.Fatalf("Reload run %d: %v", run, err)
		}
		if v, err := enginectl.ServedVersion(ctx, base, o); err != nil || v != "5" {
			t.Fatalf("ServedVersion after run %d = %q, %v; want 5", run, v, err)
		}
		var paused struct {
			IsPaused bool `json:"is_paused"`
		}
		getJSON(t, base+"/is_paused", &paused)
		if paused.IsPaused {
			t.Fatalf("server still paused after run %d", run)
		}
		for i := range 3 {
			body, _ := json.Marshal(map[string]any{
				"token_ids":       []int{151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198},
				"sampling_params": map[string]any{"max_tokens": 4, "temperature": 1.0, "seed": i, "ignore_eos": true},
			})
			resp, err := http.Post(base+"/inference/v1/generate", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			var g struct {
				WeightVersion int64 `json:"weight_version"`
				Choices       []struct {
					TokenIDs       []int   `json:"token_ids"`
					WeightVersions []int64 `json:"weight_versions"`
				} `json:"choices"`
			}
			err = json.NewDecoder(resp.Body).Decode(&g)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || len(g.Choices) != 1 {
				t.Fatalf("generate %d: HTTP %d, %v, %+v", i, resp.StatusCode, err, g)
			}
			if g.WeightVersion != 5 || len(g.Choices[0].WeightVersions) != len(g.Choices[0].TokenIDs) {
				t.Errorf("generate %d: weight_version %d, weight_versions %v for %d tokens; want 5 for each", i, g.WeightVersion, g.Choices[0].WeightVersions, len(g.Choices[0].TokenIDs))
			}
			for _, v := range g.Choices[0].WeightVersions {
				if v != 5 {
					t.Errorf("generate %d: a token from weights %d, want 5", i, v)
				}
			}
		}
	}
	var info struct {
		WeightVersion int64 `json:"weight_version"`
	}
	getJSON(t, base+"/weight_info", &info)
	if info.WeightVersion != 5 {
		t.Errorf("/weight_info = %d, want 5", info.WeightVersion)
	}
}

// serve.py with --api-key (docs/serve.md §10): kiln-sync's reload with
// the key pauses, reloads, versions and resumes it; without the key, or
// with a wrong one, the reload fails on its first call with HTTP 401 and
// a pointer at --api-key, and the server is neither paused nor reloaded.
// /health answers without the key throughout.
func TestReloadServePyAPIKey(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Python model server")
	}
	ge := gputest.Find(t)
	ckpt := ge.Tiny(t)
	base := ge.Serve(t, ckpt, "--api-key", "sekret")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	o := enginectl.Options{Protocol: enginectl.VLLM, CallTimeout: time.Minute}

	for _, key := range []string{"", "wrong"} {
		o.APIKey = key
		err := enginectl.Reload(ctx, []string{base}, ckpt, 3, o)
		if err == nil || !strings.Contains(err.Error(), "HTTP 401") || !strings.Contains(err.Error(), "--api-key") {
			t.Fatalf("Reload with key %q = %v; want HTTP 401 pointing at --api-key", key, err)
		}
		if _, err := enginectl.ServedVersion(ctx, base, o); err == nil || !strings.Contains(err.Error(), "HTTP 401") {
			t.Fatalf("ServedVersion with key %q = %v; want HTTP 401", key, err)
		}
	}
	resp, err := http.Get(base + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/health without the key: HTTP %d, want 200", resp.StatusCode)
	}

	o.APIKey = "sekret"
	if v, err := enginectl.ServedVersion(ctx, base, o); err != nil || v != "0" {
		t.Fatalf("ServedVersion with the key before the reload = %q, %v; want 0 (the refused reloads changed nothing)", v, err)
	}
	if err := enginectl.Reload(ctx, []string{base}, ckpt, 3, o); err != nil {
		t.Fatalf("Reload with the key: %v", err)
	}
	if v, err := enginectl.ServedVersion(ctx, base, o); err != nil || v != "3" {
		t.Fatalf("ServedVersion after the reload = %q, %v; want 3", v, err)
	}
	req, _ := http.NewRequest("GET", base+"/is_paused", nil)
	req.Header.Set("Authorization", "Bearer sekret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var paused struct {
		IsPaused bool `json:"is_paused"`
	}
	err = json.NewDecoder(resp.Body).Decode(&paused)
	resp.Body.Close()
	if err != nil || paused.IsPaused {
		t.Fatalf("/is_paused after the reload: %+v, %v; want resumed", paused, err)
	}
}

func getJSON(t *testing.T, u string, v any) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: HTTP %d", u, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
}
