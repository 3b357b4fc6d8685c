package stagecmd

import (
	"context"

	"golang.org/x/sync/errgroup"
)

// Each calls do for every item, at most n at once (errgroup's SetLimit),
// and sends each result on the returned channel as it is done, closing the
// channel after the last. Once ctx is done no further item is started; the
// results of the items already started are still sent, so the caller must
// receive until the channel closes. The stages that run one sandbox per
// item (kiln-grade, kiln-rollout run) consume their results this way, in
// their own goroutine: the writer is not safe for concurrent use.
func Each[T, R any](ctx context.Context, n int, items []T, do func(T) R) <-chan R {
	out := make(chan R)
	var g errgroup.Group
	g.SetLimit(max(n, 1))
	go func() {
		defer close(out)
		for _, it := range items {
			if ctx.Err() != nil {
				break
			}
			g.Go(func() error {
				if ctx.Err() == nil { // still wanted once a slot was free
					out <- do(it)
				}
				return nil
			})
		}
		_ = g.Wait() // the functions return nil
	}()
	return out
}
