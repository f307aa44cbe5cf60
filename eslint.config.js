// ESLint for the runtime's plain-JavaScript modules (runtime_template/runtime/*.js), run by tests/test_lint.py.
// The modules are parts of one ES module, the bundle (codegen/render.py concatenates them after the bundle's data:
// MODEL, TEXTURES, ...): a name one module declares at its top level is in scope in every other. So each file is
// linted with the others' top-level names (and the bundle's data) as globals, and a top-level name it declares is
// unused only if no other module reads it either.
import fs from 'node:fs';
import path from 'node:path';
import js from '@eslint/js';
import globals from 'globals';

const DIR = 'runtime_template/runtime';

// The names a module declares at its top level (function, class, const/let, and each of a const's list).
function topLevelNames(text) {
  const names = new Set();
  for (const m of text.matchAll(/^(?:export )?(?:async )?(?:function\*? |class )(\w+)/gm)) names.add(m[1]);
  for (const m of text.matchAll(/^(?:export )?(?:const|let|var) (\w+) =([^\n]*)/gm)) {
    names.add(m[1]);
    for (const more of m[2].matchAll(/, (\w+) = /g)) names.add(more[1]);
  }
  return names;
}

const files = fs.readdirSync(DIR).filter((f) => f.endsWith('.js')).sort();
const texts = Object.fromEntries(files.map((f) => [f, fs.readFileSync(path.join(DIR, f), 'utf8')]));
const declared = Object.fromEntries(files.map((f) => [f, topLevelNames(texts[f])]));
// the bundle's data, which its template declares before the modules (MODEL, TEXTURES, ...)
const DATA = topLevelNames(fs.readFileSync('runtime_template/bundle.js.j2', 'utf8'));

export default [
  js.configs.recommended,
  ...files.map((f) => {
    const others = new Set(DATA);
    for (const g of files) if (g !== f) for (const n of declared[g]) others.add(n);
    for (const n of declared[f]) others.delete(n);
    // this module's top-level names that another module reads
    const shared = [...declared[f]].filter((n) => files.some((g) => g !== f && new RegExp(`\\b${n}\\b`).test(texts[g])));
    return {
      files: [`${DIR}/${f}`],
      languageOptions: {
        ecmaVersion: 2022,
        sourceType: 'module',
        globals: { ...globals.browser, ...Object.fromEntries([...others].map((n) => [n, 'readonly'])) },
      },
      rules: {
        'no-unused-vars': ['error', { args: 'none', caughtErrors: 'none',
          varsIgnorePattern: shared.length ? `^(${shared.join('|')})$` : '^$' }],
      },
    };
  }),
];
