// The official Hugging Face JS client, run by the Go tests:
//   node check.mjs download <hubUrl> <repo> <revision> <cacheDir>   snapshotDownload; prints the snapshot path
//   node check.mjs scan <cacheDir>                                  scanCacheDir; prints repos, revisions, files, warnings as JSON
import { snapshotDownload, scanCacheDir } from "@huggingface/hub";

const [mode, ...args] = process.argv.slice(2);
if (mode === "download") {
  const [hubUrl, name, revision, cacheDir] = args;
  const path = await snapshotDownload({ repo: { type: "model", name }, hubUrl, revision, cacheDir });
  console.log(JSON.stringify({ path }));
} else if (mode === "scan") {
  const info = await scanCacheDir(args[0]);
  console.log(JSON.stringify({
    repos: info.repos.map((r) => ({
      id: r.id.name, type: r.id.type, filesCount: r.filesCount,
      revisions: r.revisions.map((v) => ({ commit: v.commitOid, refs: v.refs, files: v.files.map((f) => ({ path: f.path, size: f.blob.size })) })),
    })),
    warnings: info.warnings.map((w) => String(w)),
  }));
} else {
  console.error("usage: check.mjs download|scan ...");
  process.exit(2);
}
