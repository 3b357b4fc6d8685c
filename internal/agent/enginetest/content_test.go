package enginetest

import (
	"fmt"
	"testing"

	"github.com/kilnrl/kiln/internal/ojson"
)

// TestAppendContentC holds the shape (C) logprobs writer to the bytes
// ojson.Append writes for the generic builder, over every fault and top-k.
func TestAppendContentC(t *testing.T) {
	outputs := [][]int{nil, {IMEnd}, Encode("ok, <tool_call>x</tool_call><|im_end|>")}
	for _, ids := range outputs {
		for _, k := range []int{-1, 0, 1, 2, 5} {
			for f := NoFault; f <= FaultDropConnection; f++ {
				res := &genResult{ids: ids, k: k, lps: make([]float64, len(ids)), ranks: make([]int, len(ids))}
				for i, id := range ids {
					res.lps[i], res.ranks[i] = DefaultLogprob(id, i), defaultRank(id, i, false)
				}
				if len(ids) > 1 {
					res.lps[1], res.ranks[1] = -1e-9, 1 // a scripted logprob
				}
				name := fmt.Sprintf("ids=%d/k=%d/fault=%d", len(ids), k, f)
				want := string(ojson.Marshal(logprobsContent(res, ShapeTokenIDs, f)))
				if got := string(appendContentC([]byte(nil), res, f)); got != want {
					t.Errorf("%s:\n got %s\nwant %s", name, got, want)
				}
			}
		}
	}
}
