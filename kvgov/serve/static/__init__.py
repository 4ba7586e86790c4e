"""The live page's files (HTML, CSS, JavaScript, an icon), served by ``kvgov.serve.page``;
a package only so that they ship with kvgov as package data."""
