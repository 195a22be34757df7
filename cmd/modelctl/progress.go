package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/term"

	"github.com/modelcache/modelcache/api"
)

// progress shows a pull or a wait: on a terminal one line, redrawn in
// place, that fits the terminal's width (read again on SIGWINCH); plain
// lines otherwise. Its last line is the pull's end at 100 %; the caller
// prints the artifact's Ready line, so progress does not.
type progress struct {
	w   io.Writer
	tty bool
	fd  int

	mu      sync.Mutex
	width   int
	last    *api.Artifact // the last event's artifact, to redraw on resize
	total   int64         // the last known byte total, for the 100 % line
	rate    float64
	started time.Time
	line    string // the last line written (plain mode: written once)
	drew    bool
	stop    chan struct{}
	// finished: finish ran (it may be called again, as a deferred call).
	finished bool
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w, width: 80}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.tty, p.fd = true, int(f.Fd())
		p.resize()
		p.stop = make(chan struct{})
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		go func() {
			defer signal.Stop(winch)
			for {
				select {
				case <-winch:
					p.mu.Lock()
					p.resize()
					if p.last != nil && p.drew {
						p.drawLocked(p.last)
					}
					p.mu.Unlock()
				case <-p.stop:
					return
				}
			}
		}()
	}
	return p
}

func (p *progress) resize() {
	if w, _, err := term.GetSize(p.fd); err == nil && w > 0 {
		p.width = w
	}
}

func (p *progress) event(ev api.Event) {
	a := ev.Artifact
	if a == nil || ev.Error != nil {
		return // the error is the command's to report, not a phase to show
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if pr := a.Progress; pr != nil {
		if pr.BytesTotal > 0 {
			p.total = pr.BytesTotal
		}
		p.rate = pr.BytesPerSecond
		if !pr.Started.IsZero() {
			p.started = pr.Started
		}
	}
	p.last = a
	if a.Phase == api.PhaseReady {
		return // finish draws the end; the caller says Ready
	}
	if p.tty {
		p.drawLocked(a)
		return
	}
	if line := statusLine(a, 0, time.Now()); line != p.line {
		fmt.Fprintln(p.w, line)
		p.line = line
	}
}

func (p *progress) drawLocked(a *api.Artifact) {
	line := statusLine(a, p.width-1, time.Now()) // the last column would wrap on some terminals
	fmt.Fprintf(p.w, "\r\033[K%s", line)
	p.line, p.drew = line, true
}

// note writes a line between progress lines (a daemon that went away and
// came back): on a terminal it ends the line drawn, and the next event
// draws again below it.
func (p *progress) note(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.drew {
		fmt.Fprint(p.w, "\r\033[K")
		p.drew = false
	}
	fmt.Fprintln(p.w, "modelctl: "+msg)
	p.line = ""
}

// outage tells the user what happens while the daemon is away: a restart
// (or a daemon not up yet) is waited out, not reported as a failure.
func (p *progress) outage(until string) api.Outage {
	return api.Outage{
		Lost: func(err error, answered bool) {
			var ua *api.UnavailableError
			why := err.Error()
			if errors.As(err, &ua) {
				why = ua.Err.Error()
			}
			if answered {
				p.note(fmt.Sprintf("modelcached restarted or stopped (%s); waiting for it to come back %s…", why, until))
			} else {
				p.note(fmt.Sprintf("cannot reach modelcached at %s (%s); waiting for it %s…", ua.Socket, why, until))
			}
		},
		Back: func(away time.Duration) {
			p.note(fmt.Sprintf("modelcached is back (after %s); following again", humanDuration(away)))
		},
	}
}

// finish ends the display: on a terminal a pull that became Ready shows
// its bar at 100 % with what it took; any drawn line is ended.
func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished {
		return
	}
	p.finished = true
	if p.stop != nil {
		close(p.stop)
	}
	if !p.tty {
		return
	}
	if a := p.last; a != nil && a.Phase == api.PhaseReady && p.drew {
		fmt.Fprintf(p.w, "\r\033[K%s", doneLine(a.Name, p.total, p.started, time.Now(), p.width-1))
	}
	if p.drew {
		fmt.Fprintln(p.w)
	}
}

// statusLine renders one artifact's state in at most width columns (0:
// no limit, and no bar: a log). A download with a known size is a bar with percent, bytes,
// rate and ETA; as the width shrinks the bytes go first, then the ETA and
// rate, then the bar narrows down to nothing.
func statusLine(a *api.Artifact, width int, now time.Time) string {
	pr := a.Progress
	if a.Phase != api.PhaseDownloading || pr == nil {
		line := fmt.Sprintf("%s: %s", a.Name, a.Phase)
		if a.Message != "" {
			line += " — " + a.Message
		}
		if a.NextRetry != nil {
			line += fmt.Sprintf(" (attempt %d; next in %s)", a.Attempts, humanDuration(a.NextRetry.Sub(now)))
		}
		return fit(line, width)
	}
	if pr.FilesTotal == 0 && pr.BytesDone == 0 {
		return fit(fmt.Sprintf("%s: %s — resolving the source", a.Name, a.Phase), width)
	}
	if pr.BytesTotal <= 0 {
		return fit(fmt.Sprintf("%s: %s %s", a.Name, a.Phase, progressText(pr)), width)
	}
	have := pr.BytesDone + pr.BytesSkipped
	frac := min(1, float64(have)/float64(pr.BytesTotal))
	pct := fmt.Sprintf("%3.0f%%", 100*frac)
	size := api.FormatBytes(have) + "/" + api.FormatBytes(pr.BytesTotal)
	if pr.FilesTotal > 1 {
		size += fmt.Sprintf(" %d/%d files", pr.FilesDone, pr.FilesTotal)
	}
	rate := api.FormatBytes(int64(pr.BytesPerSecond)) + "/s"
	eta := "ETA --"
	// The rate of the first seconds says little (a connection's slow
	// start, a file that was cached): no ETA before etaAfter.
	if pr.BytesPerSecond > 0 && (pr.Started.IsZero() || now.Sub(pr.Started) >= etaAfter) {
		eta = "ETA " + humanDuration(time.Duration(float64(pr.BytesTotal-have)/pr.BytesPerSecond*float64(time.Second)))
	}
	if width <= 0 { // a log, not a terminal: words, no bar
		return fmt.Sprintf("%s: %s %s %s, %s, %s", a.Name, a.Phase, strings.TrimSpace(pct), size, rate, eta)
	}
	// As the width shrinks the sizes go first, then the ETA, then the rate.
	return barLine(a.Name, frac, width, pct, []string{size, rate, eta}, []string{rate, eta}, []string{eta})
}

// etaAfter is how long a download runs before its bar shows an ETA.
const etaAfter = 2 * time.Second

// doneLine is the bar of a finished pull: 100 %, the size, the time and
// the mean rate.
func doneLine(name string, total int64, started, now time.Time, width int) string {
	took := ""
	if !started.IsZero() {
		d := now.Sub(started)
		took = "in " + humanDuration(d)
		if s := d.Seconds(); s > 0 && total > 0 {
			took += " (" + api.FormatBytes(int64(float64(total)/s)) + "/s)"
		}
	}
	size := ""
	if total > 0 {
		size = api.FormatBytes(total)
	}
	return barLine(name, 1, width, "100%", []string{size, took}, []string{size})
}

// barLine lays out "name [====>   ] pct extras…" in width columns (0: no
// limit). layouts are the extras to show, from the most to the least;
// the first whose bar gets minBar columns wins, and when none does the
// bar narrows to what is left, or goes.
func barLine(name string, frac float64, width int, pct string, layouts ...[]string) string {
	const maxBar, minBar = 40, 10
	layouts = append(layouts, nil)
	for i, extras := range layouts {
		tail := pct
		for _, e := range extras {
			if e != "" {
				tail += "  " + e
			}
		}
		bar := maxBar
		if width > 0 {
			// "name [" + bar + "] " + tail
			bar = min(maxBar, width-utf8.RuneCountInString(name)-4-utf8.RuneCountInString(tail))
		}
		if bar < minBar && i < len(layouts)-1 {
			continue
		}
		if bar < 3 {
			return fit(name+" "+tail, width)
		}
		n := int(frac * float64(bar))
		fill := strings.Repeat("=", n)
		if n < bar && n > 0 {
			fill = strings.Repeat("=", n-1) + ">"
		}
		return fmt.Sprintf("%s [%s%s] %s", name, fill, strings.Repeat(" ", bar-n), tail)
	}
	panic("unreachable")
}

// fit cuts s to width columns (0: no limit) with an ellipsis.
func fit(s string, width int) string {
	if width <= 0 || utf8.RuneCountInString(s) <= width {
		return s
	}
	if width <= 1 {
		return string([]rune(s)[:max(width, 0)])
	}
	return string([]rune(s)[:width-1]) + "…"
}

// humanDuration is a duration the way a progress bar shows it: 45s,
// 3m05s, 2h10m.
func humanDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	d = d.Round(time.Second)
	h, m, s := int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60
	switch {
	case h > 0:
		return fmt.Sprintf("%dh%02dm", h, m)
	case m > 0:
		return fmt.Sprintf("%dm%02ds", m, s)
	}
	return fmt.Sprintf("%ds", s)
}
