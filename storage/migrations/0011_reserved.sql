-- 0011_reserved: a placeholder, so that migrations run 1..N on this branch (auto-compact2).
-- Version 11 belongs to another branch (0011_extraction.sql); at merge this file goes and
-- 0012_auto_compact.sql is numbered after whatever main holds then.
SELECT 1;
