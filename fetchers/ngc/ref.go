package ngc

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/modelcache/modelcache/fetchers"
)

// Ref is a parsed ngc:// URI.
type Ref struct {
	Org, Team, Model string
	Version          string // "" asks for the latest version
}

// String is the URI of r.
func (r Ref) String() string {
	s := "ngc://" + r.Org + "/"
	if r.Team != "" {
		s += r.Team + "/"
	}
	s += r.Model
	if r.Version != "" {
		s += ":" + r.Version
	}
	return s
}

// orgPath is r's org (and team) under the API: /v2/org/<org>[/team/<team>].
func (r Ref) orgPath() string {
	p := "/v2/org/" + r.Org
	if r.Team != "" {
		p += "/team/" + r.Team
	}
	return p
}

// modelPath is r's model under the API: the guest path
// /v2/models/<org>[/<team>]/<model>, or the org path
// /v2/org/<org>[/team/<team>]/models/<model>.
func (r Ref) modelPath(guest bool) string {
	if !guest {
		return r.orgPath() + "/models/" + r.Model
	}
	p := "/v2/models/" + r.Org
	if r.Team != "" {
		p += "/" + r.Team
	}
	return p + "/" + r.Model
}

// manifestPath is r's URL manifest: /v2/org/<org>[/team/<team>]/models/<model>/<version>/files.
func (r Ref) manifestPath() string {
	return r.orgPath() + "/models/" + r.Model + "/" + url.PathEscape(r.Version) + "/files"
}

// versionKey names r's version in the fetcher's maps.
func (r Ref) versionKey() string { return r.Org + "/" + r.Team + "/" + r.Model + ":" + r.Version }

// scope is the token endpoint's query for r's org (and team).
func (r Ref) scope() string {
	q := url.Values{"service": {"ngc"}, "scope": {"group/ngc:" + r.Org}}
	if r.Team != "" {
		q.Add("scope", "group/ngc:"+r.Org+"/"+r.Team)
	}
	return q.Encode()
}

func (r Ref) scopeName() string {
	if r.Team != "" {
		return "group/ngc:" + r.Org + "/" + r.Team
	}
	return "group/ngc:" + r.Org
}

var (
	// nameRe is an org, team or model name as NGC writes them.
	nameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	// versionRe is a version the store can name a revision with.
	versionRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

// ParseURI splits ngc://<org>[/<team>]/<model>[:<version>].
func ParseURI(uri string) (Ref, error) {
	bad := func(why string) (Ref, error) {
		return Ref{}, fmt.Errorf("source %q: %w: %s; write ngc://<org>[/<team>]/<model>[:<version>]", uri, fetchers.ErrBadSource, why)
	}
	rest, ok := strings.CutPrefix(uri, "ngc://")
	if !ok {
		return bad("not an ngc:// URI")
	}
	var r Ref
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		rest, r.Version = rest[:i], rest[i+1:]
		if r.Version == "" {
			return bad("empty version after ':'")
		}
		if !versionRe.MatchString(r.Version) || strings.Contains(r.Version, "..") {
			return bad(fmt.Sprintf("version %q: use letters, digits, '.', '_' and '-' (the version names the revision on disk)", r.Version))
		}
	}
	segs := strings.Split(rest, "/")
	switch len(segs) {
	case 2:
		r.Org, r.Model = segs[0], segs[1]
	case 3:
		r.Org, r.Team, r.Model = segs[0], segs[1], segs[2]
		if r.Team == "no-team" { // the ngc CLI's spelling of "no team"
			r.Team = ""
		}
	default:
		return bad(fmt.Sprintf("%d path segments", len(segs)))
	}
	for _, s := range segs {
		if !nameRe.MatchString(s) || strings.Contains(s, "..") {
			return bad(fmt.Sprintf("name %q", s))
		}
	}
	return r, nil
}

func teamClause(r Ref) string {
	if r.Team == "" {
		return ""
	}
	return fmt.Sprintf(" (team %q)", r.Team)
}
