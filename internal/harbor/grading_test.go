package harbor

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRewardFromJSON(t *testing.T) {
	cases := []struct {
		json, metric string
		want         float64
		err          string
	}{
		{`{"reward": 1}`, "", 1, ""},
		{`{"reward": 0.25, "other": 1}`, "", 0.25, ""},
		{`{"pass_fraction": 0.5, "passed": 2}`, "pass_fraction", 0.5, ""},
		{`{"only": 0.75}`, "", 0.75, ""},
		{`{"reward": true}`, "", 1, ""},
		{`{"a": 1, "b": 0}`, "", 0, `no metric "reward" (it has a, b)`},
		{`{"reward": "high"}`, "", 0, `is "high", not a number`},
		{`{"reward": 2}`, "", 0, "kiln's rewards are in [0, 1]"},
		{`[1]`, "", 0, "not a JSON object"},
	}
	for _, c := range cases {
		got, err := RewardFromJSON([]byte(c.json), c.metric)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, c.json)
			continue
		}
		require.NoError(t, err, c.json)
		require.Equal(t, c.want, got, c.json)
	}
}

func TestRewardFromText(t *testing.T) {
	for in, want := range map[string]float64{"1\n": 1, " 0 ": 0, "0.5": 0.5} {
		got, err := RewardFromText([]byte(in))
		require.NoError(t, err, in)
		require.Equal(t, want, got)
	}
	for _, in := range []string{"", "yes", "-1", "1.5", "NaN"} {
		_, err := RewardFromText([]byte(in))
		require.Error(t, err, in)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"": 0, "4G": 4 << 30, "512M": 512 << 20, "2Gi": 2 << 30, "1GB": 1 << 30, "2048": 2048} {
		got, err := parseSize(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"lots", "4X", "-1G", "0"} {
		_, err := parseSize(in)
		require.Error(t, err, in)
	}
}
