package rollout

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestIsNullText holds isNullText to its definition, strings.TrimSpace(s)
// == "null", including Unicode white space, which only the fallback reads.
func TestIsNullText(t *testing.T) {
	for _, s := range []string{"", "null", " null\n", "\u00a0null\u2003", "\vnull\f", "nul", "nulls", "{}", `{"role":"assistant"}`,
		" {}", "{ null", `"null"`, "Null", "null null"} {
		assert.Equal(t, strings.TrimSpace(s) == "null", isNullText(s), "%q", s)
	}
}
