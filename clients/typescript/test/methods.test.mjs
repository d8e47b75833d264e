// The client's method list is the server's: a method or parameter the server has and the
// client lacks (or the other way round) fails here.
import { test } from "node:test";
import assert from "node:assert/strict";

import { Client, METHODS, METHOD_PATHS } from "@engram/client";
import { HOST, PORT } from "./helpers.mjs";

async function liveMethods() {
  const c = new Client({ host: HOST, port: PORT }); // `methods` needs no authentication
  try {
    return await c.methods();
  } finally {
    c.close();
  }
}

/** Every function reachable through the client's namespaces, as dotted wire names. */
function clientMethods(root) {
  const out = new Map();
  const walk = (obj, path) => {
    for (const [k, v] of Object.entries(obj)) {
      if (v && typeof v === "object" && v.constructor?.name?.startsWith("Api")) walk(v, [...path, k]);
    }
    // the generated classes (Api*) hold the methods; Client adds connect/close/call
    for (let proto = Object.getPrototypeOf(obj); proto && proto !== Object.prototype;
      proto = Object.getPrototypeOf(proto)) {
      if (!proto.constructor.name.startsWith("Api")) continue;
      for (const k of Object.getOwnPropertyNames(proto)) {
        if (k !== "constructor" && typeof obj[k] === "function") out.set([...path, k].join("."), obj[k]);
      }
    }
  };
  walk(root, []);
  return out;
}

test("METHODS matches the live server's methods answer", async () => {
  const live = await liveMethods();
  assert.deepEqual(Object.keys(METHODS).sort(), live.map((m) => m.name).sort());
  for (const m of live) {
    const mine = METHODS[m.name];
    assert.deepEqual([...mine.params], m.params.map((p) => p.name), m.name);
    assert.deepEqual([...mine.required], m.params.filter((p) => p.required).map((p) => p.name), m.name);
    assert.deepEqual([...mine.flags].sort(), [...m.flags].sort(), m.name);
  }
});

test("the client has a function for every server method and no other", async () => {
  const live = await liveMethods();
  const c = new Client({ host: HOST, port: PORT });
  const fns = clientMethods(c);
  const camel = (s) => s.replace(/_([a-z])/g, (_, x) => x.toUpperCase());
  assert.deepEqual([...fns.keys()].sort(), live.map((m) => m.name.split(".").map(camel).join(".")).sort());
  for (const m of live) {
    let f = c;
    for (const part of METHOD_PATHS[m.name]) f = f[part];
    assert.equal(typeof f, "function", m.name);
  }
  c.close();
});
