package adapter

// chain keeps lists of which each begins with the one before — a session's
// prompt ids, its prefixes' message hashes, its turns' message lists: a
// coding CLI resends its whole history every turn — in one array, so that
// a session of n turns holds about one list of its longest rather than n
// lists (O(n²)).
//
// extend appends in place when the list it extends is the last one it
// returned, viewed whole: the room past that list is covered by no list
// handed out, each being cut to its length and capacity, and nothing
// handed out is ever written. Otherwise it makes an array with half again
// the room, and the caller moves the lists that are views of the old one to
// the same places in the new (rebase), so the old array is freed.
type chain[T any] struct {
	last []T // the last list extend returned, with the array's room
}

// extend returns prev followed by parts, and whether it made a new array
// (then to the caller to rebase the views of prev's array onto it).
func (c *chain[T]) extend(prev []T, parts ...[]T) (list []T, moved bool) {
	n := len(prev)
	for _, p := range parts {
		n += len(p)
	}
	g := c.last
	if len(prev) == 0 || len(g) != len(prev) || &g[0] != &prev[0] || cap(g) < n {
		g = make([]T, len(prev), n+n/2)
		copy(g, prev)
		moved = len(prev) > 0
	}
	for _, p := range parts {
		g = append(g, p...)
	}
	c.last = g
	return g[:n:n], moved
}

// rebase points each list views yields that is a view of old's array, from
// its start and no longer than old, at the same places in to, which must
// begin with old's elements: such a view holds old's first elements (what
// was handed out is never written), and so does to.
func rebase[T any](old, to []T, views func(yield func(*[]T) bool)) {
	if len(old) == 0 || len(to) == 0 || &old[0] == &to[0] {
		return
	}
	for v := range views {
		if p := *v; len(p) > 0 && len(p) <= len(old) && &p[0] == &old[0] {
			*v = to[:len(p):len(p)]
		}
	}
}

// viewsOf yields, for rebase, the list field of each element of s.
func viewsOf[E, T any](s []E, field func(*E) *[]T) func(yield func(*[]T) bool) {
	return func(yield func(*[]T) bool) {
		for i := range s {
			if !yield(field(&s[i])) {
				return
			}
		}
	}
}
