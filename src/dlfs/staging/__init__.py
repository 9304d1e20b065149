"""Staging a dataset on the client's host: what to send, read in parallel, in order.
Transport-neutral: it never imports the client (which sends what staging hands out).

- `source_files`: the vocabulary (`SourceFile`, skipped entries, the reader's context);
- `tree_walk`: directory trees (`TreeSource`, `walk_tree`);
- `file_reads`: one file of a tree read into the pool (O_DIRECT when cold);
- `tar_archive`, `tar_members`, `sequential_reads`: tar archives, streamed;
- `source_set`: what the user named, as one ordered namespace (`open_sources`);
- `duplicates`: one sample per path;
- `read_pool`: many files in flight, handed out in order, in bounded memory;
- `ordered_files`: the ingest's chunks in order, each file's CRC32C computed;
- `pace`: an ingest's cap in bytes a second (`--max-rate`);
- `resume_prefix`: what the first files add up to, for a resumed ingest;
- `progress`: the progress bar or log lines and the ingest's figures.
"""
